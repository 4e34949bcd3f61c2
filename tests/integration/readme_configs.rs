//! Every TOML example of the manual (README.md and docs/*.md) is a config
//! `fluxpipe validate` accepts: a snippet without sources gets a stdin
//! source, one without sinks a stdout sink, so a misspelt key in any
//! example fails here.

use crate::common::fluxpipe;
use std::path::Path;

fn toml_blocks(text: &str) -> Vec<String> {
    text.split("```toml")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_toml_example_of_the_manual_validates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The README and every page of docs/, in name order so block numbers
    // stay put between runs.
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut blocks = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a page of the manual");
        blocks.extend(toml_blocks(&text));
    }
    assert!(blocks.len() >= 5, "only {} TOML blocks", blocks.len());
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, block) in blocks.iter().enumerate() {
        let mut value: toml::Table = toml::from_str(block)
            .unwrap_or_else(|e| panic!("TOML block {i} of the manual is not TOML: {e}\n{block}"));
        // Paths of the examples point at system folders: keep them inside
        // the test's folder.
        value.insert(
            "data_dir".into(),
            toml::Value::String(dir.path().join("data").display().to_string()),
        );
        if !value.contains_key("sources") {
            value.insert(
                "sources".into(),
                toml::from_str::<toml::Table>("[in]\ntype = \"stdin\"")
                    .expect("source")
                    .into(),
            );
        }
        if !value.contains_key("sinks") {
            value.insert(
                "sinks".into(),
                toml::from_str::<toml::Table>("[out]\ntype = \"stdout\"\ninputs = [\"jobs\"]")
                    .expect("sink")
                    .into(),
            );
        }
        let text = toml::to_string(&value).expect("TOML");
        let path = dir.path().join(format!("block{i}.toml"));
        std::fs::write(&path, &text).expect("write");
        let out = fluxpipe()
            .current_dir(dir.path())
            .args(["validate", "--config"])
            .arg(&path)
            .output()
            .expect("run fluxpipe validate");
        assert!(
            out.status.success(),
            "TOML block {i} of the manual does not validate: {}\n{block}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
