//! o2iblnd V2 wire format (filled in by the wire work).
