//! The `ko2iblnd` tunables (filled in by the tunables work).
