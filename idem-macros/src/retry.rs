//! `#[retry_on_conflict(...)]`: the body becomes a closure that the runtime's
//! `retry_on_conflict` runs again while it returns an error that `is_conflict()`.
//!
//! The options are parsed with the helpers of `attr` (one error per mistake, all of them
//! in one build); the rewrite is one call into `__private` with the body as a closure
//! returning an `async` block, so that every run starts the body afresh.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{
    Attribute, Block, Ident, ItemFn, LitInt, LitStr, PathArguments, ReturnType, Stmt, Token, Type,
    UseTree,
};

use crate::attr::{
    CrateArg, Errors, duration_millis, parse_eq_str, parse_options, set_once, unknown_option,
};

mod kw {
    syn::custom_keyword!(attempts);
    syn::custom_keyword!(backoff);
    syn::custom_keyword!(max_backoff);
}

const OPTIONS: &[&str] = &["attempts", "backoff", "max_backoff", "crate"];

/// The name every idem expansion imports its runtime's `__private` module under. A body
/// that starts with this import was already rewritten by another idem attribute.
pub(crate) const PRIVATE_ALIAS: &str = "__idem_private";

/// `attempts = 50`
struct AttemptsArg {
    kw: Span,
    value: u32,
}

/// `backoff = "1ms"`, `max_backoff = "50ms"`
struct BackoffArg {
    kw: Span,
    lit: LitStr,
    millis: u64,
}

enum Arg {
    Attempts(AttemptsArg),
    Backoff(BackoffArg),
    MaxBackoff(BackoffArg),
    Crate(CrateArg),
}

impl Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.peek(kw::attempts) {
            let kw: kw::attempts = input.parse()?;
            AttemptsArg::parse_value(kw.span, input).map(Arg::Attempts)
        } else if input.peek(kw::backoff) {
            let kw: kw::backoff = input.parse()?;
            BackoffArg::parse_value(kw.span, "backoff", "\"1ms\"", input).map(Arg::Backoff)
        } else if input.peek(kw::max_backoff) {
            let kw: kw::max_backoff = input.parse()?;
            BackoffArg::parse_value(kw.span, "max_backoff", "\"50ms\"", input).map(Arg::MaxBackoff)
        } else if input.peek(Token![crate]) {
            let kw: Token![crate] = input.parse()?;
            CrateArg::parse_value(kw.span, input).map(Arg::Crate)
        } else {
            let name = input.call(Ident::parse_any)?;
            Err(unknown_option(&name, OPTIONS))
        }
    }
}

impl AttemptsArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        input.parse::<Token![=]>()?;
        if !input.peek(LitInt) {
            return Err(input.error(
                "`attempts` takes an integer: how many runs in all, the first included, \
                 e.g. attempts = 50",
            ));
        }
        let lit: LitInt = input.parse()?;
        let value = lit.base10_parse::<u32>().map_err(|_| {
            syn::Error::new(
                lit.span(),
                format!(
                    "`attempts = {lit}` does not fit in a u32; a bounded retry takes a few \
                     to a few hundred runs, e.g. attempts = 50"
                ),
            )
        })?;
        if value == 0 {
            return Err(syn::Error::new(
                lit.span(),
                "`attempts = 0` would never run the body: attempts counts every run, the \
                 first included; write 1 (no retry) or more, e.g. attempts = 50",
            ));
        }
        Ok(AttemptsArg { kw, value })
    }
}

impl BackoffArg {
    fn parse_value(
        kw: Span,
        what: &str,
        example: &str,
        input: ParseStream<'_>,
    ) -> syn::Result<Self> {
        let lit = parse_eq_str(input, what, example)?;
        let millis = duration_millis(&lit, what)?;
        Ok(BackoffArg { kw, lit, millis })
    }
}

/// The options as given, each at most once.
#[derive(Default)]
struct Configuration {
    attempts: Option<AttemptsArg>,
    backoff: Option<BackoffArg>,
    max_backoff: Option<BackoffArg>,
    krate: Option<CrateArg>,
}

impl Configuration {
    fn set(&mut self, arg: Arg) -> syn::Result<()> {
        match arg {
            Arg::Attempts(a) => {
                let kw = a.kw;
                set_once(&mut self.attempts, a, "attempts", kw)
            }
            Arg::Backoff(a) => {
                let kw = a.kw;
                set_once(&mut self.backoff, a, "backoff", kw)
            }
            Arg::MaxBackoff(a) => {
                let kw = a.kw;
                set_once(&mut self.max_backoff, a, "max_backoff", kw)
            }
            Arg::Crate(a) => {
                let kw = a.kw();
                set_once(&mut self.krate, a, "crate", kw)
            }
        }
    }

    fn parse(args: TokenStream, errors: &mut Errors) -> Configuration {
        let mut config = Configuration::default();
        parse_options(args, errors, Arg::parse, |arg| config.set(arg));
        if let (Some(base), Some(max)) = (&config.backoff, &config.max_backoff)
            && max.millis < base.millis
        {
            errors.push(syn::Error::new(
                max.lit.span(),
                format!(
                    "`max_backoff = {:?}` is below `backoff = {:?}`: retry n sleeps up to \
                     min(max_backoff, backoff * 2^n), so max_backoff is the cap; make it at \
                     least the backoff",
                    max.lit.value(),
                    base.lit.value()
                ),
            ));
        }
        config
    }
}

/// Expands `#[retry_on_conflict(args)] item`. On an error the original item is emitted
/// next to it, so an editor keeps seeing the function.
pub(crate) fn retry_on_conflict(args: TokenStream, item: TokenStream) -> TokenStream {
    crate::expand::on_fn(
        item,
        "#[retry_on_conflict] goes on an `async fn` with a body returning `Result<T, E>`",
        |func| expand(args, func),
        ToTokens::to_token_stream,
    )
}

fn expand(args: TokenStream, func: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let config = Configuration::parse(args, &mut errors);
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[retry_on_conflict] needs an `async fn`: the body runs again as a new future \
             after each conflict; write `async fn`",
        ));
    }
    let ret_ty = if func.attrs.iter().any(|a| is_named(a, "transition")) {
        // Above #[transition], the body yields `Result<T, E>` while the function returns
        // `Result<Step<T>, E>`. A return type #[transition] refuses is reported by it.
        match crate::transition::body_type(&sig.output, &sig.ident) {
            Ok(body_ty) => Some(body_ty),
            Err(_) => {
                errors.finish()?;
                return Ok(func.to_token_stream());
            }
        }
    } else {
        result_type(&sig.output, &sig.ident)
            .map_err(|e| errors.push(e))
            .ok()
            .cloned()
    };
    if let Some(twin) = func.attrs.iter().find(|a| is_named(a, "retry_on_conflict")) {
        errors.push(syn::Error::new_spanned(
            twin,
            "#[retry_on_conflict] is given twice; keep one (the attempts would multiply)",
        ));
    }
    if is_idem_expansion(&func.block) {
        errors.push(syn::Error::new(
            Span::call_site(),
            "#[retry_on_conflict] must be written above #[idempotent] and #[transition], not \
             below: above, the retries run inside one claim (or one held move) and the result \
             is recorded once; below, every retry would claim the key again. Move this \
             attribute to the top",
        ));
    }
    errors.finish()?;
    match ret_ty {
        Some(ret_ty) => Ok(rewrite(func, config, &ret_ty)),
        None => Err(syn::Error::new(
            Span::call_site(),
            "idem: internal error in #[retry_on_conflict], please report it",
        )),
    }
}

/// The return type, checked to be a `Result`: `Result<T, E>`, or an alias (`Result<T>`,
/// `AppResult<T>`: a path whose last name ends in `Result`). Whether `E: IsConflict` is
/// left to the type checker, which reports it on this type.
fn result_type<'a>(output: &'a ReturnType, name: &Ident) -> syn::Result<&'a Type> {
    const HOW: &str = "#[retry_on_conflict] needs the return type written as `Result<T, E>`, \
                       where `E: idem_runtime::IsConflict` tells a lost optimistic race \
                       (worth another run) from other errors";
    let whole = match output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            return Err(syn::Error::new(
                name.span(),
                format!("`{name}` returns nothing; {HOW}"),
            ));
        }
    };
    let is_result = match whole {
        Type::Path(path) => path.path.segments.last().is_some_and(|last| {
            last.ident.to_string().ends_with("Result")
                && !matches!(last.arguments, PathArguments::Parenthesized(_))
        }),
        _ => false,
    };
    if is_result {
        Ok(whole)
    } else {
        Err(syn::Error::new_spanned(whole, HOW))
    }
}

/// True if `attr`'s path ends in `name` (`#[retry_on_conflict]`,
/// `#[idem_runtime::retry_on_conflict(...)]`).
fn is_named(attr: &Attribute, name: &str) -> bool {
    attr.path().segments.last().is_some_and(|s| s.ident == name)
}

/// True if `block` is the rewrite of another idem attribute (`#[idempotent]`,
/// `#[transition]`): those start by importing the runtime's private module as
/// `__idem_private`. Attribute macros expand from the top down, so an attribute written
/// below another one sees the body already rewritten by it.
pub(crate) fn is_idem_expansion(block: &Block) -> bool {
    fn renames_to_alias(tree: &UseTree) -> bool {
        match tree {
            UseTree::Path(path) => renames_to_alias(&path.tree),
            UseTree::Rename(rename) => rename.rename == PRIVATE_ALIAS,
            UseTree::Group(group) => group.items.iter().any(renames_to_alias),
            UseTree::Name(_) | UseTree::Glob(_) => false,
        }
    }
    block.stmts.iter().any(|stmt| match stmt {
        Stmt::Item(syn::Item::Use(item)) => renames_to_alias(&item.tree),
        _ => false,
    })
}

fn rewrite(func: &ItemFn, config: Configuration, ret_ty: &Type) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let (private_path, private_span) = CrateArg::private(config.krate);
    let private = Ident::new(PRIVATE_ALIAS, Span::call_site());
    let import = quote_spanned!(private_span=> use #private_path as #private;);
    let policy = Ident::new("__IDEM_RETRY", Span::call_site());
    let ret = Ident::new("__idem_ret", Span::mixed_site());

    let some_or_none = |value: Option<TokenStream>| match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    };
    let attempts = some_or_none(config.attempts.map(|a| {
        let n = Literal::u32_unsuffixed(a.value);
        quote!(#n)
    }));
    let millis = |arg: Option<BackoffArg>| {
        some_or_none(arg.map(|a| {
            let ms = Literal::u64_unsuffixed(a.millis);
            quote!(#private::Duration::from_millis(#ms))
        }))
    };
    let (base, max) = (millis(config.backoff), millis(config.max_backoff));

    // The closure and its `async` block carry the attribute's span: if the body moves an
    // argument out (so it could not run a second time), rustc's "closure is `FnOnce`"
    // points at this attribute, with a label at the move in the body.
    let attribute = Span::call_site();
    let typed_body = crate::expand::typed_block(&ret, ret_ty, block);
    let body = quote_spanned!(attribute=> || async #typed_body);

    // As in `#[idempotent]`: every token of the call carries the span of the first token
    // of the return type, so an `E` without `IsConflict` is reported once, on the
    // signature.
    let at = crate::expand::signature_span(ret_ty);
    let private_at = Ident::new(PRIVATE_ALIAS, at);
    let function_at = Ident::new("retry_on_conflict", at);
    let mut args = Group::new(Delimiter::Parenthesis, quote!(&#policy, #body));
    args.set_span(at);
    let call = quote_spanned!(at=> #private_at::#function_at #args .await);

    quote! {
        #(#attrs)*
        #vis #sig {
            #import
            static #policy: #private::Retry = #private::retry_policy(#attempts, #base, #max);
            #call
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The marker this attribute relies on to refuse being written below `#[idempotent]`
    /// is still what `#[idempotent]` emits.
    #[test]
    fn sees_an_idempotent_expansion() {
        let item = quote! {
            async fn f(id: u64) -> Result<u64, E> { Ok(id) }
        };
        let expanded = crate::expand::idempotent(quote!(key = "{id}"), item.clone());
        let rewritten: ItemFn = syn::parse2(expanded).expect("an fn");
        assert!(is_idem_expansion(&rewritten.block));
        let plain: ItemFn = syn::parse2(item).expect("an fn");
        assert!(!is_idem_expansion(&plain.block));

        let moved = crate::transition::transition(
            quote!(machine = ORDER, key = "{id}", to = "shipped"),
            quote! { async fn f(id: u64) -> Result<Step<u64>, E> { Ok(id) } },
        );
        let moved: ItemFn = syn::parse2(moved).expect("an fn");
        assert!(is_idem_expansion(&moved.block));
    }
}
