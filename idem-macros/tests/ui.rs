//! Compile-time behaviour of `#[idempotent]`: what compiles, and for each misuse, the
//! error message and the token it points at (the `.stderr` files).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
