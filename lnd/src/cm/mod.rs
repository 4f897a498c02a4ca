//! InfiniBand connection manager: MAD codecs and the handshake state machine.
