//! `fluxpipe id` converts like `flux job id`: every id of flux-core's own
//! table, from every encoding, to every encoding.

use crate::common::{corpus, fluxpipe};

fn convert(to: &str, ids: &[&str]) -> (Vec<String>, bool) {
    let out = fluxpipe()
        .args(["id", "--to", to])
        .args(ids)
        .output()
        .expect("run fluxpipe id");
    let lines = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect();
    (lines, out.status.success())
}

#[test]
fn every_oracle_row_converts_both_ways() {
    let table = std::fs::read_to_string(corpus().join("oracles/jobid_oracle.tsv")).expect("oracle");
    let mut rows = table.lines();
    let header: Vec<&str> = rows.next().expect("header").split('\t').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let rows: Vec<Vec<&str>> = rows.map(|r| r.split('\t').collect()).collect();
    assert_eq!(rows.len(), 100);
    // (oracle column, fluxpipe encoding)
    let encodings = [
        ("dec", "dec"),
        ("hex", "hex"),
        ("kvs", "kvs"),
        ("dothex", "dothex"),
        ("words", "words"),
        ("f58", "f58"),
        ("f58plain", "f58plain"),
    ];
    for (from_col, _) in encodings {
        let inputs: Vec<&str> = rows.iter().map(|r| r[col(from_col)]).collect();
        for (to_col, to) in encodings {
            let (got, ok) = convert(to, &inputs);
            assert!(ok, "from {from_col} to {to}");
            let want: Vec<&str> = rows.iter().map(|r| r[col(to_col)]).collect();
            assert_eq!(got, want, "from {from_col} to {to}");
        }
    }
}

#[test]
fn bad_ids_fail_with_a_message_and_good_ones_still_convert() {
    let out = fluxpipe()
        .args([
            "id",
            "--to",
            "dec",
            "ƒ2GeDKtT",
            "ƒjpXCZedGfVR",
            "0x",
            " 42 ",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "48335159296\n42\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ƒjpXCZedGfVR") && err.contains("`0x`"),
        "{err}"
    );
}
