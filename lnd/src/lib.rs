//! `lnd`: a userspace re-creation of Lustre's InfiniBand network driver, o2iblnd.
//!
//! Layers, bottom up (each module's docs state its contract):
//! * [`fabric`]: a verbs-shaped device abstraction; the software RoCEv2 device lives in
//!   [`fabric::soft`], real NICs behind the `verbs` feature.
//! * [`wire`]: o2iblnd V2 messages and RDMA descriptors, byte for byte.
//! * [`cm`]: InfiniBand CM messages (MADs) and the handshake state machine.
//! * [`tunables`]: the `ko2iblnd` module options in modprobe.d format.
//!
//! The protocol core is sans-IO: it takes `now` ([`time::Instant`]) and events, and is asked for
//! output; the driver that owns threads, sockets and the OS clock is thin.

pub mod clock;
pub mod cm;
pub mod credits;
pub mod driver;
pub mod engine;
pub mod fabric;
pub mod rng;
pub mod time;
pub mod tunables;
pub mod wire;
