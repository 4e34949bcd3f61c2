//! The cost gate: figures of the per-record path that repeat exactly, held
//! against the budgets committed in `tests/cost-budgets.toml`.
//!
//! - Instructions per event, counted by valgrind's callgrind (the same for
//!   the same binary and input whatever else the machine does), of
//!   `fluxpipe replay` and of `fluxpipe run` (stdin → blackhole, one
//!   worker, alerts on the event clock) over a fixed generated journal.
//! - Bytes per active job: what the keyed processor holds (bytes asked of
//!   the allocator, counted on this thread) for a fixed number of jobs
//!   that stay active.
//!
//! A figure more than `over` above its budget fails; one more than
//! `under` below it fails too, so a change that lowers a figure lowers the
//! budget with it (docs/benchmarks.md, "The cost gate": how to move a budget
//! on purpose).
//! `FLUXPIPE_COST_REPORT=1` prints the figures as a budgets file and
//! fails nothing. Without valgrind the instruction figures are skipped
//! unless FLUXPIPE_REQUIRE_VALGRIND is set (tests/run-all sets it).

mod common;

use common::fluxpipe;
use fluxpipe::decode::{Format, Origin, decode_line};
use fluxpipe::keyed::alerts::Clock;
use fluxpipe::keyed::alerts::rule::default_rules;
use fluxpipe::keyed::processor::Processor;
use fluxpipe::workload::{Spec, Workload};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Counts the bytes live on each thread (freed memory is subtracted on
/// the thread that frees it: the processor here runs on one).
struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // Not while the thread is being torn down.
    let _ = LIVE.try_with(|l| l.set(l.get() + delta));
}

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> i64 {
    LIVE.with(Cell::get)
}

/// The fixed workload of the instruction figures.
const EVENTS_ARGS: [&str; 6] = ["--seed", "1", "--nodes", "64", "--jobs", "2500"];
/// Jobs held active for the memory figure.
const ACTIVE_JOBS: u64 = 20_000;

#[derive(Debug, serde::Deserialize)]
struct Budgets {
    over: f64,
    under: f64,
    replay_instructions_per_event: f64,
    run_instructions_per_event: f64,
    bytes_per_active_job: f64,
}

fn budgets_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cost-budgets.toml")
}

fn budgets() -> Budgets {
    let text = std::fs::read_to_string(budgets_path()).expect("tests/cost-budgets.toml");
    toml::from_str(&text).expect("tests/cost-budgets.toml")
}

fn reporting() -> bool {
    std::env::var_os("FLUXPIPE_COST_REPORT").is_some()
}

/// Hold `figure` against `budget` (printed, and nothing failed, when
/// `report`): the error says which way and by how much, and what to do.
fn check(name: &str, figure: f64, budget: f64, b: &Budgets, report: bool) -> Result<(), String> {
    let ratio = figure / budget;
    println!(
        "cost: {name} = {figure:.1} (budget {budget:.1}, {:+.2}%)",
        (ratio - 1.0) * 100.0
    );
    if report {
        println!("{name} = {}", figure.round());
        return Ok(());
    }
    if ratio > 1.0 + b.over {
        return Err(format!(
            "{name}: {figure:.1} is {:.1}% over its budget {budget:.1} (at most {:.0}%): \
             find what the change added to the per-record path",
            (ratio - 1.0) * 100.0,
            b.over * 100.0
        ));
    }
    if ratio < 1.0 - b.under {
        return Err(format!(
            "{name}: {figure:.1} is {:.1}% under its budget {budget:.1}: lower the budget \
             in tests/cost-budgets.toml to {} (FLUXPIPE_COST_REPORT=1 prints every figure)",
            (1.0 - ratio) * 100.0,
            figure.round()
        ));
    }
    Ok(())
}

#[test]
fn the_gate_fails_both_ways_past_its_margins() {
    let b = Budgets {
        over: 0.03,
        under: 0.10,
        replay_instructions_per_event: 0.0,
        run_instructions_per_event: 0.0,
        bytes_per_active_job: 0.0,
    };
    assert!(check("x", 102.9, 100.0, &b, false).is_ok());
    assert!(check("x", 90.1, 100.0, &b, false).is_ok());
    let over = check("x", 103.1, 100.0, &b, false).unwrap_err();
    assert!(over.contains("over its budget"), "{over}");
    let under = check("x", 89.9, 100.0, &b, false).unwrap_err();
    assert!(
        under.contains("lower the budget") && under.contains("to 90"),
        "{under}"
    );
    assert!(check("x", 200.0, 100.0, &b, true).is_ok());
    // The committed budgets read.
    let committed = budgets();
    assert!(
        committed.over > 0.0 && committed.over <= 0.05,
        "a few percent"
    );
}

#[test]
fn bytes_per_active_job_keep_their_budget() {
    let spec = Spec {
        seed: 1,
        jobs: ACTIVE_JOBS,
        nodes: 64,
        active: true,
        ..Spec::default()
    };
    let mut lines = Vec::new();
    for entry in Workload::new(spec) {
        let mut line = Vec::new();
        entry.journal_line(&mut line).expect("line");
        lines.push(line);
    }
    let origin = Origin::default();
    let mut alerts = Vec::new();
    let before = live_bytes();
    let mut processor =
        Processor::new(default_rules(), Clock::Event).with_max_clock_skew(f64::INFINITY);
    for line in &lines {
        for record in decode_line(line, &origin, Format::Auto).records {
            processor.process("bench", record, &mut alerts);
        }
        alerts.clear();
    }
    alerts.shrink_to_fit();
    let held = live_bytes() - before;
    let jobs = processor.state().jobs.len() as f64;
    assert_eq!(jobs, ACTIVE_JOBS as f64, "every job held");
    let per_job = held as f64 / jobs;
    drop(processor);
    let b = budgets();
    check(
        "bytes_per_active_job",
        per_job,
        b.bytes_per_active_job,
        &b,
        reporting(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Instructions callgrind counted for `cmd`, or `None` without valgrind.
fn instructions(cmd: &mut Command, dir: &Path, tag: &str) -> Option<f64> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("FLUXPIPE_REQUIRE_VALGRIND").is_none(),
            "valgrind is required here (FLUXPIPE_REQUIRE_VALGRIND) and is not installed"
        );
        eprintln!("instruction figures skipped: no valgrind");
        return None;
    }
    let out_file = dir.join(format!("callgrind.{tag}"));
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(ToOwned::to_owned).collect();
    let mut grind = Command::new("valgrind");
    grind
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(program)
        .args(args);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => grind.env(k, v),
            None => grind.env_remove(k),
        };
    }
    let stdin_file = dir.join(format!("{tag}.stdin"));
    if stdin_file.exists() {
        grind.stdin(std::fs::File::open(&stdin_file).expect("stdin"));
    } else {
        grind.stdin(Stdio::null());
    }
    let out = grind.stdout(Stdio::null()).output().expect("valgrind");
    assert!(
        out.status.success(),
        "valgrind {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_file).expect("callgrind output");
    let total = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|n| n.split_whitespace().next()?.parse::<f64>().ok())
        .expect("callgrind's total");
    Some(total)
}

#[test]
fn instructions_per_event_keep_their_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("journal.jsonl");
    common::generate(&EVENTS_ARGS, &journal);
    let events = std::fs::read_to_string(&journal)
        .expect("journal")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count() as f64;
    let b = budgets();
    let mut errors = Vec::new();

    // The floor: a typed serde_json parse of the same lines (what `fluxpipe
    // bench` calls its typed baseline). Not a budget, a yardstick: the
    // ratio says how far replay is from merely reading its input.
    let mut typed = fluxpipe();
    typed.args(["bench", "--parse-only"]).arg(&journal);
    let typed = instructions(&mut typed, dir.path(), "typed").map(|n| n / events);

    let mut replay = fluxpipe();
    replay.args(["replay", "--cluster", "bench"]).arg(&journal);
    if let Some(n) = instructions(&mut replay, dir.path(), "replay") {
        if let Some(typed) = typed {
            println!(
                "cost: typed parse = {typed:.1} instructions per event; replay is {:.2}x it \
                 ({:.3}x its speed)",
                n / events / typed,
                typed * events / n
            );
        }
        errors.extend(
            check(
                "replay_instructions_per_event",
                n / events,
                b.replay_instructions_per_event,
                &b,
                reporting(),
            )
            .err(),
        );
    }

    // The pipeline: stdin → blackhole, one worker, every stream taken.
    // The alerts on the event clock: on the wall clock, what fires
    // depends on how many timer turns pass while the journal is read
    // (the journal is dated in the past), so on the speed of the machine
    // under valgrind (6,168 alert records there, 234 at full speed).
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nworkers = 1\n\
             [sources.in]\ntype = \"stdin\"\ncluster = \"bench\"\n\
             [sinks.out]\ntype = \"blackhole\"\n\
             inputs = [\"transitions\", \"jobs\", \"resources\", \"anomalies\", \"alerts\"]\n\
             [alerts]\nclock = \"event\"\n",
            dir.path().join("state")
        ),
    )
    .expect("config");
    std::fs::copy(&journal, dir.path().join("run.stdin")).expect("stdin");
    let mut run = fluxpipe();
    run.args(["run", "--config"])
        .arg(&config)
        .env("FLUXPIPE_LOG", "error");
    if let Some(n) = instructions(&mut run, dir.path(), "run") {
        errors.extend(
            check(
                "run_instructions_per_event",
                n / events,
                b.run_instructions_per_event,
                &b,
                reporting(),
            )
            .err(),
        );
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
