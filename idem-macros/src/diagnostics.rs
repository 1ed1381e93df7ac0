//! How mistakes are reported: every error of one attribute is collected and shown in one
//! build, and a misspelt name gets a suggestion.

use proc_macro2::Span;
use syn::{Ident, LitStr};

/// Collects errors so every mistake is reported in one build.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// `unknown option `tll` (did you mean `ttl`?); valid options are: ...`, at the name.
pub(crate) fn unknown_option(name: &Ident, valid: &[&str]) -> syn::Error {
    syn::Error::new(
        name.span(),
        format!(
            "unknown option `{name}`{}; valid options are: {}",
            did_you_mean(&name.to_string(), valid),
            valid.join(", ")
        ),
    )
}

/// `unknown strategy "mutx" (did you mean `mutex`?); valid values are: ...`, at the literal.
pub(crate) fn unknown_value(lit: &LitStr, option: &str, valid: &[&str]) -> syn::Error {
    let value = lit.value();
    let listed: Vec<String> = valid.iter().map(|v| format!("\"{v}\"")).collect();
    syn::Error::new(
        lit.span(),
        format!(
            "unknown {option} \"{value}\"{}; valid values are: {}",
            did_you_mean(&value, valid),
            listed.join(", ")
        ),
    )
}

/// The error for a state the checks above should have made impossible: reported rather
/// than panicking, so the user's build still says where to look.
pub(crate) fn internal(attribute: &str) -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        format!("idem: internal error in {attribute}, please report it"),
    )
}

/// `" (did you mean `ttl`?)"` for a near miss, else nothing.
pub(crate) fn did_you_mean(given: &str, valid: &[&str]) -> String {
    valid
        .iter()
        .map(|candidate| (edit_distance(given, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= 2 && *distance < candidate.len())
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| format!(" (did you mean `{candidate}`?)"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        let options = &["key", "ttl", "lease", "on_duplicate"];
        assert_eq!(did_you_mean("tll", options), " (did you mean `ttl`?)");
        assert_eq!(
            did_you_mean("on_duplicates", options),
            " (did you mean `on_duplicate`?)"
        );
        assert_eq!(did_you_mean("colour", options), "");
        // Two edits turn any two-letter word into `id`: that is no near miss.
        assert_eq!(did_you_mean("ms", &["id"]), "");
    }

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
