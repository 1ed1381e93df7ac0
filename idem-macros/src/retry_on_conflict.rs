//! `#[retry_on_conflict(...)]`: the body becomes a closure that the runtime's
//! `retry_on_conflict` runs again while it returns an error that `is_conflict()`.
//!
//! The rewrite is one call into the runtime's private module with the body as a closure
//! returning an `async` block, so that every run starts the body afresh.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::ParseStream;
use syn::{Attribute, Ident, ItemFn, LitInt, Type};

use crate::diagnostics::{Errors, internal, unknown_option};
use crate::options::{
    Arg, CratePath, Decl, Duration, Options, Value, declare_options, parse_options,
};
use crate::rewrite::{Private, is_idem_expansion, on_fn, signature_span, typed_block};
use crate::signature::{ResultType, require_async};
use crate::transition;

const ATTRIBUTE: &str = "#[retry_on_conflict]";

declare_options! {
    /// The options of `#[retry_on_conflict]` as written, each at most once.
    struct Given {
        attempts: Attempts = "attempts" (e.g. "50"),
        backoff: Duration = "backoff" (e.g. "\"1ms\""),
        max_backoff: Duration = "max_backoff" (e.g. "\"50ms\""),
        krate: CratePath = "crate" (e.g. "\"::idem_runtime\""),
    }
}

/// The option names, for the test that the docs' table lists the same.
#[cfg(test)]
pub(crate) const OPTIONS: &[&str] = <Given as Options>::NAMES;

/// `attempts = 50`: runs in all, the first included; at least one.
struct Attempts(u32);

impl Value for Attempts {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        let Decl { name, example } = option;
        if !input.peek(LitInt) {
            return Err(input.error(format!(
                "`{name}` takes an integer: how many runs in all, the first included, \
                 e.g. {name} = {example}"
            )));
        }
        let lit: LitInt = input.parse()?;
        let value = lit.base10_parse::<u32>().map_err(|_| {
            syn::Error::new(
                lit.span(),
                format!(
                    "`{name} = {lit}` does not fit in a u32; a bounded retry takes a few \
                     to a few hundred runs, e.g. {name} = {example}"
                ),
            )
        })?;
        if value == 0 {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`{name} = 0` would never run the body: {name} counts every run, the \
                     first included; write 1 (no retry) or more, e.g. {name} = {example}"
                ),
            ));
        }
        Ok(Attempts(value))
    }
}

/// Parses the options and checks that the backoff's cap is not below its base.
fn parse(args: TokenStream, errors: &mut Errors) -> Given {
    let given =
        parse_options::<Given>(args, errors, |name| unknown_option(name, Given::NAMES)).options;
    if let (Some(base), Some(max)) = (&given.backoff, &given.max_backoff)
        && max.value.millis < base.value.millis
    {
        errors.push(syn::Error::new(
            max.value.lit.span(),
            format!(
                "`max_backoff = {:?}` is below `backoff = {:?}`: retry n sleeps up to \
                 min(max_backoff, backoff * 2^n), so max_backoff is the cap; make it at \
                 least the backoff",
                max.value.lit.value(),
                base.value.lit.value()
            ),
        ));
    }
    given
}

/// Expands `#[retry_on_conflict(args)] item`. On an error the original item is emitted
/// next to it, so an editor keeps seeing the function.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    on_fn(
        item,
        "#[retry_on_conflict] goes on an `async fn` with a body returning `Result<T, E>`",
        |func| expand_fn(args, func),
        ToTokens::to_token_stream,
    )
}

fn expand_fn(args: TokenStream, func: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let given = parse(args, &mut errors);
    let sig = &func.sig;
    require_async(
        sig,
        ATTRIBUTE,
        "the body runs again as a new future after each conflict",
        &mut errors,
    );
    let body_ty = if func.attrs.iter().any(|a| is_named(a, "transition")) {
        // Above #[transition], the body yields `Result<T, E>` while the function returns
        // `Result<Moved<T>, E>`. A return type #[transition] refuses is reported by it.
        match transition::body_type(sig) {
            Ok(body_ty) => Some(body_ty),
            Err(_) => {
                errors.finish()?;
                return Ok(func.to_token_stream());
            }
        }
    } else {
        ResultType::of(
            sig,
            "#[retry_on_conflict] needs the return type written as `Result<T, E>`, where \
             `E: idem_runtime::IsConflict` tells a lost optimistic race (worth another run) \
             from other errors",
        )
        .map(|result| result.whole.clone())
        .map_err(|e| errors.push(e))
        .ok()
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
    match body_ty {
        Some(body_ty) => Ok(rewrite(func, given, &body_ty)),
        None => Err(internal(ATTRIBUTE)),
    }
}

/// True if `attr`'s path ends in `name` (`#[retry_on_conflict]`,
/// `#[idem_runtime::retry_on_conflict(...)]`).
fn is_named(attr: &Attribute, name: &str) -> bool {
    attr.path().segments.last().is_some_and(|s| s.ident == name)
}

fn rewrite(func: &ItemFn, given: Given, ret_ty: &Type) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        .. // syn 3's `modifiers` (`default fn`): not valid on a free fn, nothing to carry over.
    } = func;
    let import = Private::new(given.krate).import();
    let private = Private::alias();
    let policy = Ident::new("__IDEM_RETRY", Span::call_site());
    let ret = Ident::new("__idem_ret", Span::mixed_site());

    let some_or_none = |value: Option<TokenStream>| match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    };
    let attempts = some_or_none(given.attempts.map(|a| {
        let n = Literal::u32_unsuffixed(a.value.0);
        quote!(#n)
    }));
    let millis = |duration: Option<Arg<Duration>>| {
        some_or_none(duration.map(|a| {
            let ms = Literal::u64_unsuffixed(a.value.millis);
            quote!(#private::Duration::from_millis(#ms))
        }))
    };
    let (base, max) = (millis(given.backoff), millis(given.max_backoff));

    // The closure and its `async` block carry the attribute's span: if the body moves an
    // argument out (so it could not run a second time), rustc's "closure is `FnOnce`"
    // points at this attribute, with a label at the move in the body.
    let attribute = Span::call_site();
    let typed_body = typed_block(&ret, ret_ty, block);
    let body = quote_spanned!(attribute=> || async #typed_body);

    // As in `#[idempotent]`: every token of the call carries the span of the first token
    // of the return type, so an `E` without `IsConflict` is reported once, on the
    // signature.
    let at = signature_span(ret_ty);
    let private_at = Private::alias_at(at);
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
    /// or `#[transition]` is still what they emit.
    #[test]
    fn sees_an_idempotent_expansion() {
        let item = quote! {
            async fn f(id: u64) -> Result<u64, E> { Ok(id) }
        };
        let expanded = crate::idempotent::expand(quote!(key = "{id}"), item.clone());
        let rewritten: ItemFn = syn::parse2(expanded).expect("an fn");
        assert!(is_idem_expansion(&rewritten.block));
        let plain: ItemFn = syn::parse2(item).expect("an fn");
        assert!(!is_idem_expansion(&plain.block));

        let moved = transition::expand(
            quote!(machine = ORDER, key = "{id}", to = "shipped"),
            quote! { async fn f(id: u64) -> Result<Moved<u64>, E> { Ok(id) } },
        );
        let moved: ItemFn = syn::parse2(moved).expect("an fn");
        assert!(is_idem_expansion(&moved.block));
    }
}
