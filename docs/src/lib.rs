//! The guides in `docs/`, as doctests: every Rust code block of every page compiles in
//! CI (`cargo test --workspace --all-features` runs them; `cargo test -p idem-docs` alone),
//! and runs unless it is marked `no_run`. A block that is not Rust says its language
//! (`sh`, `text`, `toml`); a bare fence would be compiled as Rust.
//!
//! Every page of the folder is listed in `pages!` below, and a test fails if one is
//! missing, so a new page is compiled from the start. (The README's blocks are
//! idem-runtime's doctests, and `.ci/quickstart.sh` builds its Quick start as a new
//! crate.)

/// Compiles each page's code blocks as the doctests of a unit struct, and lists the
/// pages in `PAGES` for the completeness test.
macro_rules! pages {
    ($($file:literal => $name:ident),* $(,)?) => {
        $(
            #[cfg(doctest)]
            #[doc = include_str!(concat!("../", $file))]
            struct $name;
        )*

        /// The pages compiled above.
        #[cfg(test)]
        const PAGES: &[&str] = &[$($file),*];
    };
}

pages! {
    "consumers.md" => Consumers,
    "failure-model.md" => FailureModel,
    "high-availability.md" => HighAvailability,
    "http.md" => Http,
    "operations.md" => Operations,
    "performance.md" => Performance,
    "recovery.md" => Recovery,
    "steps.md" => Steps,
}

#[cfg(test)]
mod tests {
    use super::PAGES;

    #[test]
    fn every_page_of_the_folder_is_compiled() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let mut found: Vec<String> = std::fs::read_dir(dir)
            .expect("the docs folder")
            .map(|e| {
                e.expect("a docs entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".md"))
            .collect();
        found.sort();
        let listed: Vec<String> = PAGES.iter().map(|p| (*p).to_owned()).collect();
        assert_eq!(
            found, listed,
            "every docs/*.md must be listed in docs/src/lib.rs' pages! (sorted)"
        );
    }
}
