//! Fuzz targets for every decoder of the LND, as plain functions.
//!
//! Each module is one `cargo fuzz` target (`fuzz_targets/<name>.rs` calls its `run`). The
//! functions live in this library rather than in the target files so that `cargo test` can
//! replay the committed corpus through exactly the same code without libFuzzer
//! (`tests/corpus.rs`), and so that [`seeds`] can build the seed corpus with the crates' own
//! encoders (`cargo run --example gen_corpus`).
//!
//! Every target feeds hostile bytes to a decoder that promises never to panic, and asserts the
//! cheap parts of the decoder's contract: what decodes re-encodes and decodes to the same value,
//! lengths stay inside the input, errors are reported the documented way. A failed assertion is
//! a crash to libFuzzer, exactly like a panic inside the decoder.

pub mod cm_mad;
pub mod cm_manager;
pub mod kib_rej;
pub mod lnet_hdr;
pub mod nid;
pub mod o2ib_msg;
pub mod ring;
pub mod roce_packet;
pub mod seeds;
pub mod soft_device_rx;
pub mod tunables;

mod cursor;

pub use cursor::{Cursor, put_u16};

/// A fuzz target: its name (the `fuzz_targets/<name>.rs` binary and the `corpus/<name>/`
/// directory) and its entry point.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order of `docs/fuzzing.md`.
pub const TARGETS: &[Target] = &[
    ("roce_packet", roce_packet::run),
    ("cm_mad", cm_mad::run),
    ("cm_manager", cm_manager::run),
    ("o2ib_msg", o2ib_msg::run),
    ("kib_rej", kib_rej::run),
    ("lnet_hdr", lnet_hdr::run),
    ("nid", nid::run),
    ("tunables", tunables::run),
    ("soft_device_rx", soft_device_rx::run),
    ("ring", ring::run),
];
