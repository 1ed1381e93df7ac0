//! `idem`: the operator tool.
fn main() {}
