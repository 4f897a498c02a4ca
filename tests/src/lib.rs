//! Shared harness for the end-to-end tests.
