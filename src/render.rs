//! Rendering of `cxlkv replay` reports: the terminal table and the SVG chart. The replay itself
//! (`cxlkv_tier::replay`) only produces data.

use cxlkv_tier::replay::ReplayReport;

/// An SVG line chart of prefix hit rate (memory tiers) against capacity, one line per policy
/// (Belady dashed), capacity on a log axis.
pub fn replay_svg(report: &ReplayReport) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 440.0, 60.0, 150.0, 30.0, 50.0);
    let mut caps: Vec<usize> = report.results.iter().map(|r| r.capacity_blocks).collect();
    caps.sort_unstable();
    caps.dedup();
    let (lo, hi) = (
        *caps.first().unwrap_or(&1) as f64,
        *caps.last().unwrap_or(&2) as f64,
    );
    let ymax = report
        .results
        .iter()
        .map(|r| r.prefix_hit_rate)
        .fold(10.0f64, f64::max)
        .ceil();
    let x = |c: f64| {
        ml + (w - ml - mr)
            * if hi > lo {
                (c.ln() - lo.ln()) / (hi.ln() - lo.ln())
            } else {
                0.5
            }
    };
    let y = |v: f64| h - mb - (h - mt - mb) * v / ymax;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{ml}\" y=\"18\">Prefix hit rate (DRAM + CXL pool) vs pool capacity: {}</text>\n",
        xml_escape(&report.trace)
    );
    s += &format!(
        "<line x1=\"{ml}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - mb,
        w - mr,
        h - mb
    );
    s += &format!(
        "<line x1=\"{ml}\" y1=\"{mt}\" x2=\"{ml}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - mb
    );
    for &c in &caps {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}k</text>\n",
            x(c as f64),
            h - mb + 16.0,
            c as f64 / 1000.0
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">capacity (blocks)</text>\n",
        (ml + w - mr) / 2.0,
        h - 10.0
    );
    let steps = 5;
    for i in 0..=steps {
        let v = ymax * i as f64 / steps as f64;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}%</text>\n",
            ml - 6.0,
            y(v) + 4.0
        );
        s += &format!(
            "<line x1=\"{ml}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n",
            y(v),
            w - mr,
            y(v)
        );
    }
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#444444", "#9467bd", "#8c564b",
    ];
    let mut policies: Vec<&str> = Vec::new();
    for r in &report.results {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    for (i, p) in policies.iter().enumerate() {
        let mut pts: Vec<(usize, f64)> = report
            .results
            .iter()
            .filter(|r| r.policy == *p)
            .map(|r| (r.capacity_blocks, r.prefix_hit_rate))
            .collect();
        pts.sort_by_key(|p| p.0);
        let path: Vec<String> = pts
            .iter()
            .map(|(c, v)| format!("{:.1},{:.1}", x(*c as f64), y(*v)))
            .collect();
        let dash = if *p == "belady" {
            " stroke-dasharray=\"6,4\""
        } else {
            ""
        };
        let color = colors[i % colors.len()];
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>\n",
            path.join(" ")
        );
        for (c, v) in &pts {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>\n",
                x(*c as f64),
                y(*v)
            );
        }
        let ly = mt + 20.0 + 18.0 * i as f64;
        s += &format!("<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>\n", w - mr + 10.0, w - mr + 34.0);
        s += &format!(
            "<text x=\"{}\" y=\"{}\">{}</text>\n",
            w - mr + 40.0,
            ly + 4.0,
            xml_escape(p)
        );
    }
    s += "</svg>\n";
    s
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The report as the table `cxlkv replay` prints (`format!("{}", ReplayTable(&report))`).
pub struct ReplayTable<'a>(pub &'a ReplayReport);

impl std::fmt::Display for ReplayTable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "replay of {}: {} requests, {} prompt blocks per run, {}-byte blocks, SSD tier {}",
            self.0.trace,
            self.0.requests,
            self.0.accesses,
            self.0.block_bytes,
            match (self.0.with_ssd, self.0.ssd_direct) {
                (false, _) => "off".to_string(),
                (true, Some(true)) => "on (io_uring, O_DIRECT)".to_string(),
                (true, _) => "on (io_uring, buffered: O_DIRECT refused)".to_string(),
            }
        )?;
        writeln!(
            f,
            "{:<13} {:>9} {:>8} {:>8} {:>7} {:>7} {:>7} {:>9} {:>10} {:>10} {:>10} {:>9} {:>7}",
            "policy",
            "capacity",
            "hit %",
            "sim %",
            "dram %",
            "pool %",
            "ssd %",
            "+ssd %",
            "pool>ssd",
            "ssd>pool",
            "pool>dram",
            "ssd MB/s",
            "secs"
        )?;
        let mib = |b: u64| format!("{:.1}M", b as f64 / (1 << 20) as f64);
        for r in &self.0.results {
            writeln!(
                f,
                "{:<13} {:>9} {:>8.2} {:>8.2} {:>7.2} {:>7.2} {:>7.2} {:>9.2} {:>10} {:>10} {:>10} {:>9.0} {:>7.1}",
                r.policy,
                r.capacity_blocks,
                r.prefix_hit_rate,
                r.simulated_hit_rate,
                r.dram_hit_rate,
                r.pool_hit_rate,
                r.ssd_hit_rate,
                r.prefix_hit_rate_with_ssd,
                mib(r.bytes_pool_to_ssd),
                mib(r.bytes_ssd_to_pool),
                mib(r.bytes_pool_to_dram),
                r.ssd_mb_per_s,
                r.seconds
            )?;
        }
        for cap in [8_000, 16_000] {
            if let Some((best, rate, lru, opt, closed)) = self.0.gap_closed(cap) {
                writeln!(
                    f,
                    "at {cap} blocks: LRU {lru:.2} %, Belady {opt:.2} %; the best online policy ({best}, {rate:.2} %) closes {closed:.1} % of the gap"
                )?;
            }
        }
        Ok(())
    }
}
