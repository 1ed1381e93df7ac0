//! Compile-time behaviour of `#[idempotent]`: what compiles, and for each misuse, the
//! error message and the token it points at (the `.stderr` files).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
