//! `cxlkv replay`'s rendering (the table and the SVG chart) of a real replay report.

use cxlkv::runtime::policy::PolicyKind;
use cxlkv::tier::replay::{run_replay, ReplayOptions};
use std::path::PathBuf;

#[test]
fn replay_report_renders_as_table_and_svg() {
    let dir = std::env::temp_dir().join(format!("cxlkv-render-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let part = dir.join("trace.jsonl");
    let text: String = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/traces/conversation_trace.jsonl"),
    )
    .unwrap()
    .lines()
    .take(200)
    .map(|l| format!("{l}\n"))
    .collect();
    std::fs::write(&part, text).unwrap();
    let opts = ReplayOptions {
        trace: part,
        capacities: vec![300, 1_000],
        policies: PolicyKind::ALL.to_vec(),
        block_bytes: 1000,
        spill_dir: dir.clone(),
        with_ssd: false,
        dram_blocks: None,
        ..Default::default()
    };
    let report = run_replay(&opts, &mut |_, _| {}).unwrap();
    let svg = cxlkv::render::replay_svg(&report);
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "{svg}"
    );
    let table = cxlkv::render::ReplayTable(&report).to_string();
    assert!(table.contains("belady") && table.contains("lru"), "{table}");
    let _ = std::fs::remove_dir_all(&dir);
}
