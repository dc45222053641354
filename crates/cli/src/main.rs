//! The `spillway` command line.

fn main() {}
