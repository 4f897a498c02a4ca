//! Replays the committed corpus through every target without libFuzzer, and checks the seeds
//! are the ones `lnd_fuzz::seeds` generates (run `cargo run --example gen_corpus` after changing
//! an encoder).

use std::fs;
use std::path::{Path, PathBuf};

fn corpus_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(name)
}

fn files(name: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fs::read_dir(corpus_dir(name))
        .unwrap_or_else(|e| panic!("corpus/{name}: {e}"))
        .map(|e| {
            let path = e.unwrap().path();
            (path.file_name().unwrap().to_string_lossy().into_owned(), fs::read(&path).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_target_replays_its_corpus() {
    for (name, run) in lnd_fuzz::TARGETS {
        let files = files(name);
        assert!(!files.is_empty(), "corpus/{name} is empty");
        for (file, data) in &files {
            let r = std::panic::catch_unwind(|| run(data));
            assert!(r.is_ok(), "{name}: corpus/{name}/{file} fails");
        }
        println!("{name}: {} inputs replayed", files.len());
    }
}

#[test]
fn committed_seeds_are_current() {
    for (name, _) in lnd_fuzz::TARGETS {
        let seeds = lnd_fuzz::seeds::seeds(name);
        assert!(seeds.len() >= 10, "{name}: only {} seeds", seeds.len());
        let committed: Vec<(String, Vec<u8>)> =
            files(name).into_iter().filter(|(f, _)| f.starts_with("seed-")).collect();
        let mut generated = seeds.clone();
        generated.sort();
        let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&committed), names(&generated), "{name}: seed files differ (run gen_corpus)");
        for ((file, got), (_, want)) in committed.iter().zip(&generated) {
            assert!(got == want, "{name}: {file} is stale (run `cargo run --example gen_corpus`)");
        }
    }
}
