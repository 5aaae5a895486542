//! The demo library function on a small synthetic sequence plus the real tensors: exact recall,
//! fewer bytes over the link for NDP, and a JSON report with the documented fields.

use cxlkv_ndp::demo::{run_demo, DemoOptions};

#[test]
fn small_demo_is_exact_and_saves_link_bytes() {
    let opts = DemoOptions {
        tokens: 8192,
        k: 32,
        ..DemoOptions::default()
    };
    let mut lines = 0;
    let r = run_demo(&opts, &mut |_| lines += 1).unwrap();
    assert!(lines > 0);
    assert!(r.runs.len() >= 2, "{r}");
    for run in &r.runs {
        assert_eq!(run.recall, 1.0, "{r}");
        assert_eq!(run.device_steps, run.steps, "{r}");
        assert!(run.link_ratio > 1.0, "{r}");
        assert!(
            run.attn_rel_err.is_finite() && run.ndp_link_bytes > 0,
            "{r}"
        );
    }
    let j = r.to_json();
    for f in [
        "tokens",
        "k",
        "host_link_bytes",
        "ndp_link_bytes",
        "link_ratio",
        "recall",
        "attn_rel_err",
        "blocks_pruned_frac",
        "host_ms",
        "ndp_ms",
    ] {
        assert!(j["runs"][0].get(f).is_some(), "missing {f}");
    }
    println!("{r}");
}
