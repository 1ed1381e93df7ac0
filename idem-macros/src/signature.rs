//! Checks on the function as written, shared by every attribute: that it is `async`,
//! that it returns a `Result`, and that what the options name (key placeholders,
//! parameters) exists in its signature.

use syn::ext::IdentExt;
use syn::{FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Signature, Type};

use crate::diagnostics::Errors;
use crate::key::Template;

/// `attribute` needs an `async fn`; `why` says what the body runs as.
pub(crate) fn require_async(sig: &Signature, attribute: &str, why: &str, errors: &mut Errors) {
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!("{attribute} needs an `async fn`: {why}; write `async fn`"),
        ));
    }
}

/// A return type checked to be a `Result`: a path whose last name is `Result` or ends in
/// it (`Result<T, E>`, `std::result::Result<T, E>`, `io::Result<T>`, `AppResult<T>`).
/// What `T` and `E` must satisfy is left to the type checker, which reports an unmet
/// bound on this type.
pub(crate) struct ResultType<'a> {
    pub(crate) whole: &'a Type,
    /// The type arguments as written: `[T, E]`, `[T]` for a one-parameter alias.
    pub(crate) args: Vec<&'a Type>,
}

impl<'a> ResultType<'a> {
    /// The return type of `sig`, or an error that says `how` the attribute needs it.
    pub(crate) fn of(sig: &'a Signature, how: &str) -> syn::Result<Self> {
        let whole = match &sig.output {
            ReturnType::Type(_, ty) => &**ty,
            ReturnType::Default => {
                let name = &sig.ident;
                return Err(syn::Error::new(
                    name.span(),
                    format!("`{name}` returns nothing; {how}"),
                ));
            }
        };
        let last = match whole {
            Type::Path(path) => path.path.segments.last(),
            _ => None,
        };
        let args = match last.map(|last| (last.ident.to_string(), &last.arguments)) {
            Some((name, arguments)) if name.ends_with("Result") => match arguments {
                PathArguments::None => Vec::new(),
                PathArguments::AngleBracketed(generics) => generics
                    .args
                    .iter()
                    .filter_map(|arg| match arg {
                        GenericArgument::Type(ty) => Some(ty),
                        _ => None,
                    })
                    .collect(),
                PathArguments::Parenthesized(_) => {
                    return Err(syn::Error::new_spanned(whole, how));
                }
            },
            _ => return Err(syn::Error::new_spanned(whole, how)),
        };
        Ok(ResultType { whole, args })
    }

    /// `T`: the first type argument, where `Result` and every alias of it in common use
    /// put it; `None` for an alias that takes none.
    pub(crate) fn ok(&self) -> Option<&'a Type> {
        self.args.first().copied()
    }

    /// The same type with `T` replaced by `ok`: `Result<Moved<T>, E>` to `Result<T, E>`.
    pub(crate) fn with_ok(&self, ok: Type) -> Type {
        let mut ty = self.whole.clone();
        if let Type::Path(path) = &mut ty
            && let Some(last) = path.path.segments.last_mut()
            && let PathArguments::AngleBracketed(generics) = &mut last.arguments
            && let Some(first) = generics
                .args
                .iter_mut()
                .find(|arg| matches!(arg, GenericArgument::Type(_)))
        {
            *first = GenericArgument::Type(ok);
        }
        ty
    }
}

/// What a key template and the options that name parameters may name.
struct Params {
    has_self: bool,
    /// Parameters bound to a plain identifier (`order`, `mut cents`).
    plain: Vec<Ident>,
    /// Names bound inside destructuring patterns: usable in the body, but the key must
    /// name a whole argument so that what identifies an operation is explicit.
    nested: Vec<Ident>,
}

impl Params {
    fn of(func: &ItemFn) -> Self {
        let mut params = Params {
            has_self: false,
            plain: Vec::new(),
            nested: Vec::new(),
        };
        for input in &func.sig.inputs {
            match input {
                FnArg::Receiver(_) => params.has_self = true,
                FnArg::Typed(typed) => match &*typed.pat {
                    Pat::Ident(pat) => params.plain.push(pat.ident.clone()),
                    other => collect_bindings(other, &mut params.nested),
                },
            }
        }
        params
    }

    fn contains(&self, name: &str) -> bool {
        (name == "self" && self.has_self) || self.plain.iter().any(|p| p.unraw() == name)
    }

    fn is_nested(&self, name: &str) -> bool {
        self.nested.iter().any(|p| p.unraw() == name)
    }

    /// "`order`, `cents`", or a note that there are none.
    fn listing(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        if self.has_self {
            names.push("`self`".to_owned());
        }
        names.extend(self.plain.iter().map(|p| format!("`{}`", p.unraw())));
        if names.is_empty() {
            "it has no parameters that can be named".to_owned()
        } else {
            format!("its parameters are {}", names.join(", "))
        }
    }
}

fn collect_bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                collect_bindings(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| collect_bindings(&f.pat, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| collect_bindings(p, out)),
        Pat::Reference(r) => collect_bindings(&r.pat, out),
        Pat::Paren(p) => collect_bindings(&p.pat, out),
        Pat::Type(t) => collect_bindings(&t.pat, out),
        _ => {}
    }
}

/// Every placeholder of `key` and every identifier in `named` must name a parameter of
/// `func`. `named` pairs an identifier written in an option (`transaction = tx`, a
/// fingerprint entry) with how messages call that option; its error points at the
/// identifier.
pub(crate) fn check_references(
    func: &ItemFn,
    key: &Template,
    named: &[(&Ident, &str)],
    errors: &mut Errors,
) {
    let params = Params::of(func);
    let fn_name = &func.sig.ident;
    let explain = |name: &str| {
        if params.is_nested(name) {
            format!(
                "`{name}` is bound inside a destructuring pattern; bind that argument to a \
                 plain name (e.g. `arg: Type`) and destructure it in the body"
            )
        } else {
            format!(
                "`{fn_name}` has no parameter `{name}`; {}",
                params.listing()
            )
        }
    };
    for placeholder in key.placeholders() {
        let name = placeholder.root.name();
        if !params.contains(&name) {
            let message = if name == "self" {
                "`{self}` is used in the key, but this is not a method taking `self`".to_owned()
            } else {
                format!(
                    "`{}` in the key does not start with a parameter: {}",
                    placeholder.source,
                    explain(&name)
                )
            };
            errors.push(syn::Error::new(key.lit.span(), message));
        }
    }
    for (ident, option) in named {
        let name = ident.unraw().to_string();
        if !params.contains(&name) {
            errors.push(syn::Error::new(
                ident.span(),
                format!(
                    "{option} names `{name}`, which is not a parameter: {}",
                    explain(&name)
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::{ToTokens, quote};

    fn result_type(item: proc_macro2::TokenStream) -> Result<(String, Vec<String>), String> {
        let func: ItemFn = syn::parse2(item.clone()).unwrap_or_else(|e| panic!("{item}: {e}"));
        match ResultType::of(&func.sig, "needs a Result") {
            Ok(ty) => Ok((
                ty.whole.to_token_stream().to_string(),
                ty.args
                    .iter()
                    .map(|t| t.to_token_stream().to_string())
                    .collect(),
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn any_path_ending_in_result_is_a_result() {
        for (item, args) in [
            (
                quote!(
                    fn f() -> Result<u8, E> {}
                ),
                vec!["u8", "E"],
            ),
            (
                quote!(
                    fn f() -> std::result::Result<u8, E> {}
                ),
                vec!["u8", "E"],
            ),
            (
                quote!(
                    fn f() -> io::Result<u8> {}
                ),
                vec!["u8"],
            ),
            (
                quote!(
                    fn f() -> AppResult<'static, u8> {}
                ),
                vec!["u8"],
            ),
            (
                quote!(
                    fn f() -> ChargeResult {}
                ),
                vec![],
            ),
        ] {
            let (_, found) = result_type(item).expect("a Result");
            assert_eq!(found, args);
        }
        for item in [
            quote!(
                fn f() -> Option<u8> {}
            ),
            quote!(
                fn f() -> &Result<u8, E> {}
            ),
            quote!(
                fn f() -> impl Result<u8> {}
            ),
        ] {
            assert_eq!(result_type(item), Err("needs a Result".to_owned()));
        }
        assert_eq!(
            result_type(quote!(
                fn charge() {}
            )),
            Err("`charge` returns nothing; needs a Result".to_owned())
        );
    }

    #[test]
    fn with_ok_replaces_the_first_type_argument() {
        let func: ItemFn = syn::parse2(quote!(
            fn f() -> r::Result<'a, Moved<u8>, E> {}
        ))
        .expect("an fn");
        let ty = ResultType::of(&func.sig, "").expect("a Result");
        let body = ty.with_ok(syn::parse_quote!(u8));
        assert_eq!(
            body.to_token_stream().to_string(),
            "r :: Result < 'a , u8 , E >"
        );
    }
}
