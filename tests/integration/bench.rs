//! `fluxpipe bench --short` keeps working: every figure line is printed
//! with a positive number. Timings are never asserted.

use crate::common::fluxpipe;

fn first_number(line: &str) -> Option<f64> {
    let (_, rest) = line.split_once(':')?;
    rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| !t.is_empty() && t.chars().any(|c| c.is_ascii_digit()))
        .and_then(|t| t.parse().ok())
}

#[test]
fn bench_short_prints_every_figure() {
    let out = fluxpipe()
        .args(["bench", "--short"])
        .output()
        .expect("run fluxpipe bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures = [
        "baseline serde_json typed",
        "baseline serde_json Value",
        "-> blackhole, 1 worker:",
        "-> file, 1 worker:",
        "peak resident memory",
        "bytes per active job",
        "latency socket write -> transition out",
        "queried back to back",
    ];
    for figure in figures {
        let line = text
            .lines()
            .find(|l| l.contains(figure))
            .unwrap_or_else(|| panic!("no `{figure}` line in:\n{text}"));
        let n = first_number(line).unwrap_or_else(|| panic!("no number in `{line}`"));
        assert!(n > 0.0, "`{line}`");
        if figure.starts_with("baseline") || figure.starts_with("->") {
            assert!(
                line.contains("events/s") && line.contains("MiB/s"),
                "{line}"
            );
        }
        if figure.starts_with("latency") {
            assert!(line.contains("p50") && line.contains("p99"), "{line}");
        }
    }
    // Every pipeline line has its ratio to the typed baseline.
    let pipelines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("fluxpipe stdin ->"))
        .collect();
    assert!(pipelines.len() >= 2, "{text}");
    assert!(
        pipelines.iter().all(|l| l.contains("x typed baseline")),
        "{text}"
    );
    // Replay drives the same processor: its speed beside the pipeline's.
    assert!(
        text.lines().any(|l| l.starts_with("fluxpipe replay (")
            && first_number(l).is_some_and(|n| n > 0.0)
            && l.contains("x typed baseline")),
        "no replay figure in:\n{text}"
    );
    for timed in ["checkpoint time", "restore time"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(timed) && l.contains(" s (")),
            "no `{timed}` figure in:\n{text}"
        );
    }
}
