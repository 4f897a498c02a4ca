//! Writes the seed corpus: `corpus/<target>/seed-*` for every target, from `lnd_fuzz::seeds`.
//!
//! `cargo run --example gen_corpus` (from `lnd/fuzz`). Existing `seed-*` files of a target are
//! replaced; other files (inputs libFuzzer found and we kept) are left alone.

use std::fs;
use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, _) in lnd_fuzz::TARGETS {
        let dir = root.join(name);
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seed-")) {
                fs::remove_file(path)?;
            }
        }
        let seeds = lnd_fuzz::seeds::seeds(name);
        let bytes: usize = seeds.iter().map(|(_, b)| b.len()).sum();
        for (file, data) in &seeds {
            fs::write(dir.join(file), data)?;
        }
        println!("{name}: {} seeds, {bytes} bytes", seeds.len());
    }
    Ok(())
}
