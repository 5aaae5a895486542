//! What `cxlkv eval` prints: the table, the JSON object, the modeled CXL cost and the SVG plot of
//! quality against link bytes per token.

use super::score::Scored;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// The modeled link: PCIe 5.0 x8, which CXL 2.0/3.x x8 runs on: 32 GT/s × 8 lanes with
/// 128b/130b encoding ≈ 31.5 GB/s per direction (PCI-SIG, PCIe 5.0 Base Specification). Read and
/// write bytes are charged serially on one direction (conservative).
pub const LINK_BYTES_PER_S: f64 = 31.5e9;
/// One device command's round trip across the link: descriptor fetch, result and completion
/// write, completion read, each a CXL.mem access of ~250 ns over local DRAM (Sun et al.,
/// "Demystifying CXL Memory with Genuine CXL-Ready Systems and Devices", MICRO 2023, measure
/// 170–250 ns of added latency): 4 × 250 ns.
pub const COMMAND_ROUND_TRIP_S: f64 = 1.0e-6;
/// The device's scan of its own memory: two DDR5-4800 channels (2 × 38.4 GB/s peak) at the
/// issue's 0.8 of read bandwidth.
pub const DEVICE_SCAN_BYTES_PER_S: f64 = 0.8 * 76.8e9;

/// The link the cost model charges: bandwidth and a device command's round trip. The defaults
/// are the datasheet figures above; `cxlkv eval --link-gbps --link-latency-us` replaces them with
/// measured ones (`cxlkv bench gpu` measures a host-to-GPU link; docs/EVAL.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Bytes per second, both directions charged serially.
    pub bytes_per_s: f64,
    /// One device command's round trip, seconds.
    pub round_trip_s: f64,
}

impl Default for Link {
    fn default() -> Self {
        Link {
            bytes_per_s: LINK_BYTES_PER_S,
            round_trip_s: COMMAND_ROUND_TRIP_S,
        }
    }
}

impl Link {
    /// True if these are the datasheet figures.
    fn is_datasheet(&self) -> bool {
        *self == Link::default()
    }

    /// The cost model in words, with this link's figures.
    pub fn note(&self) -> String {
        let (gbps, us) = (self.bytes_per_s / 1e9, self.round_trip_s * 1e6);
        let what = if self.is_datasheet() {
            "CXL x8, datasheet".to_string()
        } else {
            format!(
                "given link; the datasheet's is {} GB/s, {} us",
                LINK_BYTES_PER_S / 1e9,
                COMMAND_ROUND_TRIP_S * 1e6
            )
        };
        format!(
            "modeled ms/token ({what}) = dense's measured host ms/token + link bytes / {gbps} GB/s \
             + device commands × {us} us + device scan bytes / 61.4 GB/s (0.8 × 2 DDR5-4800 \
             channels), serially"
        )
    }
}

/// One mode's results.
pub struct ModeResult {
    /// The mode as given (`topk:256+dense0`).
    pub mode: String,
    /// The teacher-forced pass.
    pub scored: Scored,
    /// True if the mode keeps K/V in the pool (its cost crosses the link).
    pub uses_pool: bool,
    /// Pass-key results: (depth, prompt length, correct, answer) per prompt.
    pub passkey: Vec<(f64, usize, bool, String)>,
}

impl ModeResult {
    fn per_token(&self, x: u64) -> f64 {
        x as f64 / self.scored.steps.max(1) as f64
    }
    /// Mean value rows that entered each query head's attention.
    pub fn value_rows_per_head(&self) -> f64 {
        let s = &self.scored.stats;
        s.value_rows as f64 / s.query_heads.max(1) as f64
    }
    /// Bytes across the link per token, both directions.
    pub fn link_bytes_per_token(&self) -> f64 {
        let s = &self.scored.stats;
        self.per_token(s.link_read_bytes + s.link_write_bytes)
    }
    /// Measured wall time per scored token.
    pub fn ms_per_token(&self) -> f64 {
        self.scored.wall.as_secs_f64() * 1e3 / self.scored.steps.max(1) as f64
    }
    /// The link model: host compute (dense's measured ms/token) + link bytes at the link's
    /// bandwidth ([`LINK_BYTES_PER_S`] by default) + commands × its round trip
    /// ([`COMMAND_ROUND_TRIP_S`]) + device scan bytes at [`DEVICE_SCAN_BYTES_PER_S`], serially.
    /// Modes without the pool: their measured time.
    pub fn modeled_ms_per_token(&self, dense_ms: f64, link: &Link) -> f64 {
        if !self.uses_pool {
            return self.ms_per_token();
        }
        let s = &self.scored.stats;
        dense_ms
            + 1e3
                * (self.link_bytes_per_token() / link.bytes_per_s
                    + self.per_token(s.device_commands) * link.round_trip_s
                    + self.per_token(s.device_scan_bytes) / DEVICE_SCAN_BYTES_PER_S)
    }
    /// Fraction of pass-key prompts answered right, if any ran.
    pub fn passkey_accuracy(&self) -> Option<f64> {
        (!self.passkey.is_empty())
            .then(|| self.passkey.iter().filter(|p| p.2).count() as f64 / self.passkey.len() as f64)
    }
}

/// The run's setting, for the header and the JSON.
pub struct Setting {
    /// The model's name and file.
    pub model: String,
    /// The model's name (the plot's title).
    pub model_name: String,
    /// Text file.
    pub text: String,
    /// Tokens the text has.
    pub text_tokens: usize,
    /// The window.
    pub context: usize,
    /// Scored tokens (decode steps).
    pub scored: usize,
    /// Prefilled positions.
    pub prefill: usize,
    /// Where pool modes keep K/V and which device serves them.
    pub environment: String,
    /// The link the cost model charges.
    pub link: Link,
}

/// The table for stdout.
pub fn table(setting: &Setting, results: &[ModeResult], dense_ms: f64, dense_ppl: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "eval of {} on {} ({} tokens): window {} tokens, {} prefilled exactly, last {} scored \
         one decode step each; {}",
        setting.model,
        setting.text,
        setting.text_tokens,
        setting.context,
        setting.prefill,
        setting.scored,
        setting.environment
    );
    let passkey = results.iter().any(|r| !r.passkey.is_empty());
    let _ = write!(
        s,
        "{:<22} {:>10} {:>8} {:>7} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>8} {:>9} {:>9} {:>9}",
        "mode",
        "ppl",
        "ppl/dn",
        "top1",
        "KL",
        "V rows/h",
        "link B/tok",
        "read B/tok",
        "write B/tok",
        "scan B/tok",
        "cmd/tok",
        "ms/tok",
        "model ms",
        "left out"
    );
    if passkey {
        let _ = write!(s, " {:>8}", "passkey");
    }
    s.push('\n');
    for r in results {
        let st = &r.scored.stats;
        let _ = write!(
            s,
            "{:<22} {:>10.4} {:>8.4} {:>7.4} {:>9.2e} {:>9.1} {:>11.0} {:>11.0} {:>11.0} {:>11.0} \
             {:>8.1} {:>9.2} {:>9.2} {:>9}",
            r.mode,
            r.scored.perplexity,
            r.scored.perplexity / dense_ppl,
            r.scored.top1_agreement,
            r.scored.kl,
            r.value_rows_per_head(),
            r.link_bytes_per_token(),
            r.per_token(st.link_read_bytes),
            r.per_token(st.link_write_bytes),
            r.per_token(st.device_scan_bytes),
            r.per_token(st.device_commands),
            r.ms_per_token(),
            r.modeled_ms_per_token(dense_ms, &setting.link),
            st.left_out_mass()
                .map_or_else(|| "-".to_string(), |m| format!("{m:.2e}"))
        );
        if !r.passkey.is_empty() {
            let right = r.passkey.iter().filter(|p| p.2).count();
            let _ = write!(s, " {:>4}/{:<3}", right, r.passkey.len());
        }
        s.push('\n');
    }
    let _ = writeln!(s, "{}", setting.link.note());
    s
}

/// The `--json` object.
pub fn json(setting: &Setting, results: &[ModeResult], dense_ms: f64, dense_ppl: f64) -> Value {
    let modes: Vec<Value> = results
        .iter()
        .map(|r| {
            let st = &r.scored.stats;
            let mut m = json!({
                "mode": r.mode,
                "perplexity": r.scored.perplexity,
                "perplexity_ratio": r.scored.perplexity / dense_ppl,
                "top1_agreement": r.scored.top1_agreement,
                "kl": r.scored.kl,
                "value_rows_per_head": r.value_rows_per_head(),
                "link_bytes_per_token": r.link_bytes_per_token(),
                "link_read_bytes_per_token": r.per_token(st.link_read_bytes),
                "link_write_bytes_per_token": r.per_token(st.link_write_bytes),
                "device_scan_bytes_per_token": r.per_token(st.device_scan_bytes),
                "left_out_mass": st.left_out_mass(),
                "rescored_rows_per_head": (st.rescored_rows > 0)
                    .then(|| st.rescored_rows as f64 / st.selected_heads.max(1) as f64),
                "device_commands_per_token": r.per_token(st.device_commands),
                "device_ms_per_token": r.per_token(st.device_ns) / 1e6,
                "ms_per_token": r.ms_per_token(),
                "modeled_ms_per_token": r.modeled_ms_per_token(dense_ms, &setting.link),
            });
            if let Some(acc) = r.passkey_accuracy() {
                let mut depths: Vec<f64> = r.passkey.iter().map(|p| p.0).collect();
                depths.sort_by(f64::total_cmp);
                depths.dedup();
                let per_depth: Vec<Value> = depths
                    .iter()
                    .map(|&d| {
                        let at: Vec<_> = r.passkey.iter().filter(|p| p.0 == d).collect();
                        let right = at.iter().filter(|p| p.2).count();
                        json!({"depth": d, "prompts": at.len(), "accuracy": right as f64 / at.len() as f64})
                    })
                    .collect();
                let prompts: Vec<Value> = r
                    .passkey
                    .iter()
                    .map(|p| json!({"depth": p.0, "length": p.1, "correct": p.2, "answer": p.3}))
                    .collect();
                m["passkey"] =
                    json!({"accuracy": acc, "per_depth": per_depth, "prompts": prompts});
            }
            m
        })
        .collect();
    json!({
        "model": setting.model,
        "text": setting.text,
        "text_tokens": setting.text_tokens,
        "context": setting.context,
        "scored": setting.scored,
        "prefill": setting.prefill,
        "environment": setting.environment,
        "cost_model": setting.link.note(),
        "link": {"bytes_per_s": setting.link.bytes_per_s, "round_trip_s": setting.link.round_trip_s},
        "modes": modes,
    })
}

/// SVG of quality (perplexity / dense's) against cost, one labeled point per mode, two panels side
/// by side: against device scan bytes per token (what the memory next to the device reads) and
/// against link bytes per token (log axes); modes that scan or move nothing sit in a "0" column.
pub fn plot(setting: &Setting, results: &[ModeResult], dense_ppl: f64) -> String {
    let (w, h) = (760.0, 460.0);
    let quality = |r: &ModeResult| r.scored.perplexity / dense_ppl;
    let device: Vec<(f64, f64, &str)> = results
        .iter()
        .map(|r| {
            (
                r.per_token(r.scored.stats.device_scan_bytes),
                quality(r),
                r.mode.as_str(),
            )
        })
        .collect();
    let link: Vec<(f64, f64, &str)> = results
        .iter()
        .map(|r| (r.link_bytes_per_token(), quality(r), r.mode.as_str()))
        .collect();
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        2.0 * w
    );
    let title = |what: &str| {
        format!(
            "Perplexity / dense vs {what} per token: {}, window {}, {} scored",
            xml_escape(&setting.model_name),
            setting.context,
            setting.scored
        )
    };
    s += "<g class=\"device\">\n";
    s += &panel(
        &device,
        &title("device scan bytes"),
        "device scan bytes per token (log; 0 = no device)",
    );
    s += &format!("</g>\n<g class=\"link\" transform=\"translate({w},0)\">\n");
    s += &panel(
        &link,
        &title("link bytes"),
        "link bytes per token (log; 0 = host memory only)",
    );
    s += "</g>\n</svg>\n";
    s
}

/// One panel of [`plot`]: the points `(bytes, quality, mode)`.
fn panel(pts: &[(f64, f64, &str)], title: &str, x_label: &str) -> String {
    let (w, h, ml, mr, mt, mb) = (760.0, 460.0, 70.0, 40.0, 40.0, 55.0);
    let linked: Vec<f64> = pts.iter().map(|p| p.0).filter(|&b| b > 0.0).collect();
    let lo = linked.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = linked.iter().copied().fold(0.0f64, f64::max);
    let (dlo, dhi) = if linked.is_empty() {
        (0.0, 1.0)
    } else {
        (
            lo.log10().floor(),
            hi.log10().ceil().max(lo.log10().floor() + 1.0),
        )
    };
    let zero_col = ml + 30.0;
    let (x0, x1) = (ml + 80.0, w - mr);
    let x = |b: f64| {
        if b <= 0.0 {
            zero_col
        } else {
            x0 + (x1 - x0) * (b.log10() - dlo) / (dhi - dlo)
        }
    };
    let ys: Vec<f64> = pts.iter().map(|p| p.1).filter(|v| v.is_finite()).collect();
    let ymin = ys.iter().copied().fold(1.0f64, f64::min).min(1.0);
    let ymax = ys.iter().copied().fold(1.0f64, f64::max);
    let pad = ((ymax - ymin) * 0.1).max(0.002);
    let (ylo, yhi) = (ymin - pad, ymax + pad);
    let y = |v: f64| h - mb - (h - mt - mb) * (v.clamp(ylo, yhi) - ylo) / (yhi - ylo);
    let mut s = format!("<text x=\"{ml}\" y=\"20\">{title}</text>\n");
    s += &format!(
        "<line x1=\"{ml}\" y1=\"{b}\" x2=\"{x1}\" y2=\"{b}\" stroke=\"black\"/>\n<line x1=\"{ml}\" y1=\"{mt}\" x2=\"{ml}\" y2=\"{b}\" stroke=\"black\"/>\n",
        b = h - mb
    );
    s += &format!(
        "<text x=\"{zero_col}\" y=\"{}\" text-anchor=\"middle\">0</text>\n",
        h - mb + 16.0
    );
    let mut d = dlo;
    while d <= dhi + 1e-9 && !linked.is_empty() {
        let xv = x(10f64.powf(d));
        s += &format!(
            "<text x=\"{xv:.1}\" y=\"{}\" text-anchor=\"middle\">1e{d:.0}</text>\n<line x1=\"{xv:.1}\" y1=\"{mt}\" x2=\"{xv:.1}\" y2=\"{}\" stroke=\"#eee\"/>\n",
            h - mb + 16.0,
            h - mb
        );
        d += 1.0;
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x_label}</text>\n",
        (ml + w - mr) / 2.0,
        h - 12.0
    );
    for i in 0..=5 {
        let v = ylo + (yhi - ylo) * i as f64 / 5.0;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.4}</text>\n<line x1=\"{ml}\" y1=\"{:.1}\" x2=\"{x1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n",
            ml - 6.0,
            y(v) + 4.0,
            y(v),
            y(v)
        );
    }
    s += &format!(
        "<line x1=\"{ml}\" y1=\"{:.1}\" x2=\"{x1}\" y2=\"{:.1}\" stroke=\"#888\" stroke-dasharray=\"5,4\"/>\n",
        y(1.0),
        y(1.0)
    );
    for (i, &(b, v, name)) in pts.iter().enumerate() {
        let color = if b > 0.0 { "#1f77b4" } else { "#444444" };
        let (px, py) = (x(b), y(v));
        s += &format!("<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"{color}\"/>\n");
        // Alternate label sides so that neighbours do not overprint.
        let dy = if i % 2 == 0 { -8.0 } else { 16.0 };
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{}</text>\n",
            px + 6.0,
            py + dy,
            xml_escape(name)
        );
    }
    s
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlkv::model::AttentionStats;
    use std::time::Duration;

    fn result(mode: &str, uses_pool: bool, stats: AttentionStats, ppl: f64) -> ModeResult {
        ModeResult {
            mode: mode.into(),
            scored: Scored {
                perplexity: ppl,
                top1_agreement: 1.0,
                kl: 0.0,
                stats,
                wall: Duration::from_millis(40),
                steps: 2,
            },
            uses_pool,
            passkey: Vec::new(),
        }
    }

    /// Two steps: per-token figures halve the counters; the model adds each term to dense's ms.
    #[test]
    fn per_token_figures_and_the_cost_model() {
        let stats = AttentionStats {
            query_heads: 10,
            value_rows: 1000,
            link_read_bytes: 2 * 31_500_000,
            link_write_bytes: 0,
            device_commands: 2 * 1000,
            device_scan_bytes: 2 * 61_440_000,
            device_ns: 0,
            ..AttentionStats::default()
        };
        let r = result("ndp-exact", true, stats, 10.0);
        assert_eq!(r.value_rows_per_head(), 100.0);
        assert_eq!(r.link_bytes_per_token(), 31_500_000.0);
        assert_eq!(r.ms_per_token(), 20.0);
        // 5 ms of host + 1 ms of link + 1000 × 1 us + 1 ms of device scan.
        let datasheet = Link::default();
        assert!((r.modeled_ms_per_token(5.0, &datasheet) - 8.0).abs() < 1e-9);
        // A measured link of half the bandwidth and twice the round trip: 2 ms of link, 2 ms of
        // commands.
        let measured = Link {
            bytes_per_s: 15.75e9,
            round_trip_s: 2e-6,
        };
        assert!((r.modeled_ms_per_token(5.0, &measured) - 10.0).abs() < 1e-9);
        assert!(datasheet.note().contains("31.5 GB/s") && datasheet.note().contains("datasheet"));
        assert!(measured.note().contains("15.75 GB/s") && measured.note().contains("2 us"));
        let dense = result("dense", false, AttentionStats::default(), 9.0);
        assert_eq!(
            dense.modeled_ms_per_token(5.0, &measured),
            20.0,
            "measured, not modeled"
        );
    }

    #[test]
    fn plot_and_json_carry_every_mode() {
        let setting = Setting {
            model: "m (f)".into(),
            model_name: "m<1>".into(),
            text: "t".into(),
            text_tokens: 10,
            context: 8,
            scored: 2,
            prefill: 5,
            environment: "e".into(),
            link: Link::default(),
        };
        let mut link = AttentionStats {
            link_read_bytes: 5000,
            device_scan_bytes: 80_000,
            ..AttentionStats::default()
        };
        link.record_left_out(0.25);
        link.record_left_out(0.75);
        let rs = [
            result("dense", false, AttentionStats::default(), 9.0),
            result("topk:4+dense0", true, link, 9.9),
        ];
        let svg = plot(&setting, &rs, 9.0);
        // Two panels (device scan bytes, link bytes), each with every mode.
        let (device, linked) = svg.split_once("<g class=\"link\"").unwrap();
        for panel in [device, linked] {
            assert!(panel.contains(">dense</text>") && panel.contains(">topk:4+dense0</text>"));
            assert!(panel.contains("m&lt;1&gt;"));
        }
        assert!(device.contains("device scan bytes per token") && linked.contains("link bytes"));
        assert!(svg.ends_with("</svg>\n"));
        let j = json(&setting, &rs, 5.0, 9.0);
        assert_eq!(j["modes"][1]["link_bytes_per_token"], 2500.0);
        assert_eq!(j["modes"][1]["device_scan_bytes_per_token"], 40_000.0);
        assert_eq!(j["modes"][1]["left_out_mass"], 0.5);
        assert!(j["modes"][0]["left_out_mass"].is_null());
        assert!((j["modes"][1]["perplexity_ratio"].as_f64().unwrap() - 1.1).abs() < 1e-12);
        let t = table(&setting, &rs, 5.0, 9.0);
        assert!(
            t.contains("topk:4+dense0") && t.contains("31.5 GB/s"),
            "{t}"
        );
    }
}
