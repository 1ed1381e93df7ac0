//! `#[transition(machine = ORDER, key = "{order_id}", to = "shipped")]`: the body runs as
//! a state-machine move, only for the caller that performs it.
//!
//! The key template is the one of `#[idempotent]` (`key::Template`), checked against the
//! signature by the same function (`signature::check_references`). The rewrite is one
//! call into the runtime's private module with the body as an `async move` block yielding
//! `Result<T, E>`, while the function returns `Result<Moved<T>, E>`.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::ParseStream;
use syn::spanned::Spanned;
use syn::{GenericArgument, Ident, ItemFn, LitStr, PathArguments, Signature, Type};

use crate::diagnostics::{Errors, internal, unknown_option};
use crate::key::Template;
use crate::options::{CratePath, Decl, Options, Value, declare_options, parse_options, string};
use crate::rewrite::{Private, on_fn, signature_span, typed_block};
use crate::signature::{ResultType, check_references, require_async};

const ATTRIBUTE: &str = "#[transition]";

const EXAMPLE: &str = "#[transition(machine = ORDER, key = \"{order_id}\", to = \"shipped\")]";

declare_options! {
    /// The options of `#[transition]` as written, each at most once.
    struct Given {
        machine: Machine = "machine" (e.g. "ORDER"),
        key: Template = "key" (e.g. "\"{order_id}\""),
        to: ToState = "to" (e.g. "\"shipped\""),
        krate: CratePath = "crate" (e.g. "\"::idem_runtime\""),
    }
}

/// The option names, for the test that the docs' table lists the same.
#[cfg(test)]
pub(crate) const OPTIONS: &[&str] = <Given as Options>::NAMES;

/// `machine = ORDER`: the path of a static `StateMachine`.
struct Machine(syn::Path);

impl Value for Machine {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        let Decl { name, example } = option;
        if input.peek(LitStr) {
            let lit: LitStr = input.parse()?;
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`{name}` takes the path of a static StateMachine, not a string; write it \
                     without quotes, e.g. {name} = {}",
                    lit.value()
                ),
            ));
        }
        let path: syn::Path = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                format!(
                    "`{name}` takes the path of a static StateMachine (or a static that \
                     derefs to one, like a LazyLock<StateMachine>), e.g. {name} = {example}"
                ),
            )
        })?;
        Ok(Machine(path))
    }
}

/// `to = "shipped"`: a state's name, not empty.
struct ToState(LitStr);

impl Value for ToState {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        let lit = string(input, option)?;
        if lit.value().is_empty() {
            let Decl { name, example } = option;
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`{name}` is empty; name the state this move enters, e.g. {name} = {example}"
                ),
            ));
        }
        Ok(ToState(lit))
    }
}

/// The checked options.
struct Checked {
    machine: syn::Path,
    key: Template,
    to: LitStr,
    private: Private,
}

/// An option of `#[idempotent]` that a move does not take says where it belongs.
fn unknown(name: &Ident) -> syn::Error {
    match name.to_string().as_str() {
        option @ ("lease" | "wait" | "ttl") => syn::Error::new(
            name.span(),
            format!(
                "`{option}` belongs to the state machine, not to one move: set it where \
                 the machine is built, with StateMachine::builder(..).{option}(..)"
            ),
        ),
        _ => unknown_option(name, Given::NAMES),
    }
}

/// Parses the options; `None` if a required one is missing or did not parse (each
/// mistake is in `errors`).
fn parse(args: TokenStream, errors: &mut Errors) -> Option<Checked> {
    let parsed = parse_options::<Given>(args, errors, unknown);
    let mut missing = |name: &str, what: &str| {
        // An option that was written but did not parse has its own error already.
        if !parsed.failed(name) {
            errors.push(syn::Error::new(
                Span::call_site(),
                format!("missing `{name}`: {what}, e.g. {EXAMPLE}"),
            ));
        }
    };
    let given = &parsed.options;
    if given.machine.is_none() {
        missing(
            "machine",
            "name the static StateMachine this move belongs to",
        );
    }
    if given.key.is_none() {
        missing(
            "key",
            "name which record moves (an order id, an approval id)",
        );
    }
    if given.to.is_none() {
        missing("to", "name the state this move enters");
    }
    let given = parsed.options;
    Some(Checked {
        machine: given.machine?.value.0,
        key: given.key?.value,
        to: given.to?.value.0,
        private: Private::new(given.krate),
    })
}

/// Expands `#[transition(args)] item`. On an error the function is still emitted next to
/// it, so an editor keeps seeing it (see `unexpanded`).
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    on_fn(
        item,
        "#[transition] goes on an `async fn` with a body returning `Result<Moved<T>, E>`",
        |func| expand_fn(args, func),
        unexpanded,
    )
}

/// The function as written, for when the attribute has an error. Its body yields
/// `Result<T, E>` where the signature says `Result<Moved<T>, E>`, so emitting it unchanged
/// would add a type error to the real one; the body is kept (type-checked, for the
/// editor) in a block that is never run, and the function diverges.
fn unexpanded(func: &ItemFn) -> TokenStream {
    let Ok(body_ty) = body_type(&func.sig) else {
        // The return type is the mistake: as written, it agrees with the body.
        return func.to_token_stream();
    };
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        .. // syn 3's `modifiers` (`default fn`): not valid on a free fn, nothing to carry over.
    } = func;
    let ret = Ident::new("__idem_ret", Span::mixed_site());
    let typed_body = typed_block(&ret, &body_ty, block);
    quote! {
        #(#attrs)*
        #vis #sig {
            let _ = async move #typed_body;
            ::core::unreachable!("#[transition] did not expand: see its compile error")
        }
    }
}

fn expand_fn(args: TokenStream, func: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let checked = parse(args, &mut errors);
    let sig = &func.sig;
    require_async(
        sig,
        ATTRIBUTE,
        "the body runs as a future while the move is held",
        &mut errors,
    );
    let types = step_types(sig).map_err(|e| errors.push(e)).ok();
    // The key's placeholders are checked exactly as `#[idempotent]` checks its key.
    if let Some(checked) = &checked {
        check_references(func, &checked.key, &[], &mut errors);
    }
    errors.finish()?;
    match (checked, types) {
        (Some(checked), Some(types)) => Ok(rewrite(func, checked, types)),
        _ => Err(internal(ATTRIBUTE)),
    }
}

/// The declared `Result<Moved<T>, E>` and the `Result<T, E>` the body yields.
struct StepTypes<'a> {
    whole: &'a Type,
    body: Type,
}

fn step_types(sig: &Signature) -> syn::Result<StepTypes<'_>> {
    const HOW: &str = "#[transition] needs the return type written as `Result<Moved<T>, E>` \
                       (or `Result<Moved, E>` for T = ()): the caller that performs the move \
                       gets `Moved::Performed { from, value }` with the body's `Ok(value)`, the \
                       others `Moved::AlreadyThere`; `E: From<idem_runtime::Error>` carries \
                       idem's own errors, such as an invalid transition";
    let result = ResultType::of(sig, HOW)?;
    // `Moved<T>` must be visible to be rewritten to `T`, and an alias that fixes the error
    // type would hide which of its parameters is `T`.
    let [ok, _err] = result.args.as_slice() else {
        return Err(syn::Error::new_spanned(
            result.whole,
            format!(
                "{HOW} (a `Result` alias with one parameter hides the error type; write both \
                 out)"
            ),
        ));
    };
    let value = step_value(ok)?;
    Ok(StepTypes {
        whole: result.whole,
        body: result.with_ok(value),
    })
}

/// The `Result<T, E>` that the body of a function returning `Result<Moved<T>, E>` yields,
/// for `#[retry_on_conflict]` written above `#[transition]`.
pub(crate) fn body_type(sig: &Signature) -> syn::Result<Type> {
    step_types(sig).map(|types| types.body)
}

/// `T` of `Moved<T>` (`()` for a bare `Moved`), or an error at the `Ok` type.
fn step_value(ok: &Type) -> syn::Result<Type> {
    let wrong = || {
        syn::Error::new_spanned(
            ok,
            format!(
                "#[transition] functions return `Result<Moved<T>, E>`, not `Result<{}, E>`: \
                 the caller that performs the move gets `Moved::Performed {{ from, value }}` \
                 with the body's `Ok(value)`, the others `Moved::AlreadyThere`; write \
                 `Result<Moved<{}>, E>` and keep returning `Ok(value)` from the body",
                ok.to_token_stream(),
                ok.to_token_stream()
            ),
        )
    };
    let Type::Path(path) = ok else {
        return Err(wrong());
    };
    let Some(last) = path.path.segments.last() else {
        return Err(wrong());
    };
    if last.ident != "Moved" && last.ident != "Step" {
        return Err(wrong());
    }
    match &last.arguments {
        PathArguments::None => Ok(syn::parse_quote_spanned!(last.ident.span()=> ())),
        // `Moved<A, B>` is reported by rustc itself; the expansion goes on with `A`.
        PathArguments::AngleBracketed(generics) => match generics.args.first() {
            Some(GenericArgument::Type(value)) => Ok(value.clone()),
            _ => Err(wrong()),
        },
        PathArguments::Parenthesized(_) => Err(wrong()),
    }
}

fn rewrite(func: &ItemFn, checked: Checked, types: StepTypes<'_>) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        .. // syn 3's `modifiers` (`default fn`): not valid on a free fn, nothing to carry over.
    } = func;
    let import = checked.private.import();
    let private = Private::alias();

    // Locals get mixed-site hygiene: the user's body cannot see or shadow them.
    let rt = Ident::new("__idem_rt", Span::mixed_site());
    let machine = Ident::new("__idem_machine", Span::mixed_site());
    let key = Ident::new("__idem_key", Span::mixed_site());
    let ret = Ident::new("__idem_ret", Span::mixed_site());

    // Spanned at the path: a static of another type is reported there.
    let path = &checked.machine;
    let machine_ref = quote_spanned!(path.span()=> &#path);
    let rendered_key = checked.key.render();
    let to = &checked.to;
    let body_ty = &types.body;

    // The body's type is `Result<T, E>`, so `Ok(value)` and `?` in it work as in any
    // function returning that.
    let typed_body = typed_block(&ret, body_ty, block);
    let body = quote!(async move #typed_body);

    // As in `#[idempotent]`: every token of the call carries the span of the first token
    // of the return type, so an `E` without `From<idem_runtime::Error>` is reported once,
    // on the signature, by the assertion below.
    let at = signature_span(&types.whole);
    let private_at = Private::alias_at(at);
    let function_at = Ident::new("transition", at);
    let mut args = Group::new(
        Delimiter::Parenthesis,
        quote!(#rt, #machine, #key, #to, #body),
    );
    args.set_span(at);
    let call = quote_spanned!(at=> #private_at::#function_at::<_, _, _> #args .await);
    // Asserted first, so a missing `From` is one error that says what to write.
    let whole = &types.whole;
    let bounds = quote_spanned!(at=>
        #private_at::carries_idem_errors(::core::marker::PhantomData::<#whole>);
    );

    quote! {
        #(#attrs)*
        #vis #sig {
            #import
            #bounds
            let #machine: &#private::StateMachine = #machine_ref;
            let #rt = #private::current();
            let #key = #rt.state_key(#machine, #rendered_key);
            #call
        }
    }
}
