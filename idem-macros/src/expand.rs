//! The rewrite: the body becomes an `async move` block handed to one runtime function.
//!
//! Everything the expansion needs from the runtime is under `#krate::__private`; the
//! signature, attributes and visibility of the function are kept as written, so call
//! sites do not change.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::{FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::attr::{Config, Configuration, Errors, OnDuplicate, Strategy};

/// Expands `#[idempotent(args)] item`. On any error the original item is emitted next to
/// the errors, so an editor still sees the function and one mistake does not cascade into
/// "cannot find function" errors at every call site.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    on_fn(
        item,
        "#[idempotent] goes on an `async fn` with a body returning `Result<T, E>`",
        |func| expand(args, func),
        ToTokens::to_token_stream,
    )
}

/// The frame of each attribute of this crate: parses `item` as a function and expands
/// it. Anything else is an error saying where the attribute goes (`misplaced`); an
/// expansion error is emitted next to `keep(func)`, the function as an editor should go
/// on seeing it.
pub(crate) fn on_fn(
    item: TokenStream,
    misplaced: &str,
    expand: impl FnOnce(&ItemFn) -> syn::Result<TokenStream>,
    keep: impl FnOnce(&ItemFn) -> TokenStream,
) -> TokenStream {
    let func = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), misplaced).to_compile_error();
            return quote!(#item #error);
        }
    };
    match expand(&func) {
        Ok(tokens) => tokens,
        Err(error) => {
            let error = error.to_compile_error();
            let func = keep(&func);
            quote!(#func #error)
        }
    }
}

fn expand(args: TokenStream, func: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let config = Configuration::parse(args, &mut errors);
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[idempotent] needs an `async fn`: the body runs as a future under the \
             runtime's claim; write `async fn`",
        ));
    }
    let result = result_type(&sig.output, &sig.ident)
        .map_err(|e| errors.push(e))
        .ok();
    let params = Params::of(func);
    if let Some(config) = &config {
        check_references(config, &params, &sig.ident, &mut errors);
    }
    errors.finish()?;
    match (config, result) {
        (Some(config), Some(ret_ty)) => Ok(rewrite(func, &config, ret_ty)),
        // Both were parsed or an error was returned above.
        _ => Err(syn::Error::new(
            Span::call_site(),
            "idem: internal error in #[idempotent], please report it",
        )),
    }
}

/// The return type, checked to be written as `Result<T, E>`. `T` and `E` themselves are
/// left to the type checker, which reports unmet bounds on this type.
fn result_type<'a>(output: &'a ReturnType, name: &Ident) -> syn::Result<&'a Type> {
    const HOW: &str = "#[idempotent] needs the return type written as `Result<T, E>`, \
                       where `T` is the value a duplicate gets back and \
                       `E: From<idem_runtime::Error>` carries idem's own errors";
    let whole = match output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            return Err(syn::Error::new(
                name.span(),
                format!("`{name}` returns nothing; {HOW}"),
            ));
        }
    };
    let wrong = || {
        syn::Error::new_spanned(
            whole,
            format!(
                "{HOW} (a `Result` alias with one parameter hides the error type; \
                 write both out)"
            ),
        )
    };
    let Type::Path(path) = whole else {
        return Err(wrong());
    };
    let Some(last) = path.path.segments.last() else {
        return Err(wrong());
    };
    if last.ident != "Result" {
        return Err(wrong());
    }
    let PathArguments::AngleBracketed(generics) = &last.arguments else {
        return Err(wrong());
    };
    let mut types = generics.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(_ok), Some(_err), None) => Ok(whole),
        _ => Err(wrong()),
    }
}

/// The body as a block of type `ty`: `{ let ret: ty = block; ret }`. The annotated `let`
/// fixes the block's type, so `?`, `Ok(..)` and early `return` in it work exactly as they
/// did in the function before the rewrite, whatever wraps the block (`async move`, a
/// closure).
pub(crate) fn typed_block(ret: &Ident, ty: &impl ToTokens, block: &impl ToTokens) -> TokenStream {
    quote! {{
        let #ret: #ty = #block;
        #[allow(unreachable_code)]
        #ret
    }}
}

/// The span of the first token of the user's return type. Every token of a runtime call
/// that checks bounds on the caller's types carries it: rustc checks a bound at the
/// path, the call and the `.await`, and merges identical errors only when their spans
/// are equal, so an unmet bound is then reported once, on the signature (a range over
/// the whole type would be cut differently by each check).
pub(crate) fn signature_span(ret_ty: &impl ToTokens) -> Span {
    ret_ty
        .to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |t| t.span())
}

/// `T` of a return type already checked to be `Result<T, E>`.
fn ok_type(ret_ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ret_ty else {
        return None;
    };
    let PathArguments::AngleBracketed(generics) = &path.path.segments.last()?.arguments else {
        return None;
    };
    generics.args.iter().find_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

/// Whether a type's tokens name a lifetime or a reference.
fn borrows(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Punct(p) => p.as_char() == '\'' || p.as_char() == '&',
        proc_macro2::TokenTree::Group(g) => borrows(g.stream()),
        _ => false,
    })
}

/// What the key template and the fingerprint may name.
pub(crate) struct Params {
    has_self: bool,
    /// Parameters bound to a plain identifier (`order`, `mut cents`).
    plain: Vec<Ident>,
    /// Names bound inside destructuring patterns: usable in the body, but the key must
    /// name a whole argument so that what identifies an operation is explicit.
    nested: Vec<Ident>,
}

impl Params {
    pub(crate) fn of(func: &ItemFn) -> Self {
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

/// Every key placeholder and fingerprint entry must name a parameter.
pub(crate) fn check_references(
    config: &Config,
    params: &Params,
    fn_name: &Ident,
    errors: &mut Errors,
) {
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
    for placeholder in config.key.placeholders() {
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
            errors.push(syn::Error::new(config.key.lit.span(), message));
        }
    }
    // An option that names a parameter by its identifier (`transaction`, fingerprint
    // entries): the error points at that identifier.
    let mut must_name_a_parameter = |ident: &Ident, option: &str| {
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
    };
    if let Some(tx) = &config.transaction {
        must_name_a_parameter(tx, "`transaction`");
    }
    for entry in &config.fingerprint {
        must_name_a_parameter(entry, "the fingerprint");
    }
}

fn rewrite(func: &ItemFn, config: &Config, ret_ty: &Type) -> TokenStream {
    let (private_path, private_span) = &config.private;
    // One `use` names the runtime's private module; every other path goes through it.
    let private = Ident::new("__idem_private", Span::call_site());
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;

    // Locals get mixed-site hygiene: the user's body cannot see or shadow them.
    let rt = Ident::new("__idem_rt", Span::mixed_site());
    let key = Ident::new("__idem_key", Span::mixed_site());
    let fp = Ident::new("__idem_fp", Span::mixed_site());
    let builder = Ident::new("__idem_builder", Span::mixed_site());
    let error = Ident::new("__idem_error", Span::mixed_site());
    let ret = Ident::new("__idem_ret", Span::mixed_site());
    let options = format_ident!("__IDEM_OPTIONS");

    let name = format!("::{}", sig.ident.unraw());
    let millis = |ms: u64| {
        let ms = Literal::u64_unsuffixed(ms);
        quote!(#private::Duration::from_millis(#ms))
    };
    let (constructor, codec) = match config.strategy {
        Strategy::Dedup => ("dedup", true),
        Strategy::Token => ("token", true),
        Strategy::Lock => ("lock", false),
    };
    let constructor = Ident::new(constructor, Span::call_site());
    let mut spec = quote!(#private::Options::#constructor(
        ::core::concat!(::core::module_path!(), #name)
    ));
    if let Some(ttl) = config.ttl_ms {
        let ttl = millis(ttl);
        spec.extend(quote!(.ttl(#ttl)));
    }
    let (lease, wait) = (millis(config.lease_ms), millis(config.wait_ms));
    spec.extend(quote!(.lease(#lease).wait(#wait)));
    match config.on_duplicate {
        Some(OnDuplicate::Replay) => {
            spec.extend(quote!(.on_duplicate(#private::OnDuplicate::Replay)));
        }
        Some(OnDuplicate::Reject) => {
            spec.extend(quote!(.on_duplicate(#private::OnDuplicate::Reject)));
        }
        None => {}
    }

    let writer = format_ident!("__idem_w");
    let key_parts = config.key.render_parts(&writer, &private);
    let import = quote_spanned!(*private_span=> use #private_path as #private;);

    let fingerprint = if !codec {
        // A lock has no record to compare a fingerprint with (`build` rejects one).
        TokenStream::new()
    } else if config.fingerprint.is_empty() {
        quote!(let #fp = ::core::option::Option::None;)
    } else {
        let adds = config.fingerprint.iter().map(|arg| {
            // Spanned at the entry, so a non-`Serialize` argument is reported there.
            quote_spanned! {arg.span()=>
                if let ::core::result::Result::Err(#error) = #builder.add(&#arg) {
                    return ::core::result::Result::Err(::core::convert::From::from(#error));
                }
            }
        });
        quote! {
            let #fp = {
                let mut #builder = #private::FingerprintBuilder::new();
                #(#adds)*
                ::core::option::Option::Some(#builder.finish())
            };
        }
    };

    let replays = config.on_duplicate == Some(OnDuplicate::Replay);

    let typed_body = typed_block(&ret, ret_ty, block);
    let body = quote!(async move #typed_body);

    // An unmet bound (`T` not serde where it is replayed, `E` without
    // `From<idem_runtime::Error>`) is reported once, on the signature.
    let at = signature_span(ret_ty);
    let private_at = Ident::new("__idem_private", at);
    let constructor_at = Ident::new(&constructor.to_string(), at);
    // Replays by clone on an in-process store when the `Ok` type allows it; decided by
    // method lookup on a probe (see `idem_runtime::CloneReplay`), so no bound is added
    // to the function. A type with borrowed parts is left out: lookup ignores lifetimes,
    // so the probe would pick the clone path and then fail the `'static` it needs.
    let reuse = format_ident!("__idem_reuse");
    let replay_now = match ok_type(ret_ty) {
        Some(ok) if codec && replays && !borrows(ok.to_token_stream()) => {
            let replay_now_at = Ident::new("replay_now", at);
            let mut args = Group::new(Delimiter::Parenthesis, quote!(&#rt, &#key, #fp, #reuse));
            args.set_span(at);
            let early = quote_spanned!(at=> #private_at::#replay_now_at #args);
            quote! {
                let #reuse = {
                    #[allow(unused_imports)]
                    use #private::{ByClone as _, ByDecode as _};
                    (&&#private::Probe::<#ok>::NEW).clone_replay()
                };
                if let ::core::option::Option::Some(#ret) = #early {
                    return #ret;
                }
            }
        }
        _ if codec => quote!(let #reuse = ::core::option::Option::None;),
        _ => TokenStream::new(),
    };
    let (generics, args) = if codec {
        let codec = Ident::new(
            match (replays, config.cache_err) {
                (true, false) => "ReplayOk",
                (true, true) => "ReplayResult",
                (false, false) => "NoReplay",
                (false, true) => "NoReplayResult",
            },
            at,
        );
        (
            quote_spanned!(at=> <#private_at::#codec, _, _, _>),
            quote!(#rt, &#options, #key, #fp, #reuse, #body),
        )
    } else {
        (
            quote_spanned!(at=> <_, _, _>),
            quote!(#rt, &#options, #key, #body),
        )
    };
    let mut args = Group::new(Delimiter::Parenthesis, args);
    args.set_span(at);
    let call = quote_spanned!(at=> #private_at::#constructor_at::#generics #args .await);

    if let Some(tx) = &config.transaction {
        // Transactional mode: claim in the caller's transaction, run the body inline (it
        // borrows that transaction), then record the result in it. The body is an
        // `async` block of its own so that a `return` in it still reaches `tx_end`.
        let codec = Ident::new(if replays { "ReplayOk" } else { "NoReplay" }, at);
        let begin_at = Ident::new("tx_begin", at);
        let end_at = Ident::new("tx_end", at);
        let conn = quote_spanned!(tx.span()=> &mut *#tx);
        let claim = format_ident!("__idem_claim");
        let error = format_ident!("__idem_error");
        return quote! {
            #(#attrs)*
            #vis #sig {
                #import
                static #options: #private::Options = #spec;
                let #rt = #private::current();
                let #key = #rt.key_parts(&#options, |#writer| #key_parts);
                #fingerprint
                let #claim = match #private_at::#begin_at::<#private_at::#codec, _, _, _>(
                    &#rt, &#options, #conn, #key, #fp,
                ).await {
                    ::core::result::Result::Ok(#private::TxBegun::Replayed(#ret)) => return #ret,
                    ::core::result::Result::Ok(#private::TxBegun::Claimed(#claim)) => #claim,
                    ::core::result::Result::Err(#error) => {
                        return ::core::result::Result::Err(::core::convert::From::from(#error));
                    }
                };
                let #ret: #ret_ty = async #typed_body.await;
                if let ::core::result::Result::Err(#error) =
                    #private_at::#end_at::<#private_at::#codec, _, _, _>(#claim, #conn, &#ret).await
                {
                    return ::core::result::Result::Err(::core::convert::From::from(#error));
                }
                #ret
            }
        };
    }

    quote! {
        #(#attrs)*
        #vis #sig {
            #import
            static #options: #private::Options = #spec;
            let #rt = #private::current();
            let #key = #rt.key_parts(&#options, |#writer| #key_parts);
            #fingerprint
            #replay_now
            #call
        }
    }
}
