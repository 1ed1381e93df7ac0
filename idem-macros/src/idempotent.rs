//! `#[idempotent(...)]`: its options, the rules that involve several of them, and the
//! rewrite, where the body becomes an `async move` block handed to one runtime function.
//!
//! Everything the expansion needs from the runtime is under the runtime's private module
//! (`rewrite::Private`); the signature, attributes and visibility of the function are
//! kept as written, so call sites do not change.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, Token, bracketed};

use crate::diagnostics::{Errors, internal, unknown_option};
use crate::key::Template;
use crate::options::{
    CratePath, Decl, Duration, Flag, Options, Value, choice, declare_options, parse_options,
};
use crate::recover::Recover;
use crate::rewrite::{Private, on_fn, signature_span, typed_block};
use crate::signature::{ResultType, check_references, require_async};

const ATTRIBUTE: &str = "#[idempotent]";

declare_options! {
    /// The options of `#[idempotent]` as written, each at most once. The table in the
    /// crate's docs of `idempotent` lists the same options, in the same order.
    struct Given {
        key: Template = "key" (e.g. "\"charge:{order.id}\""),
        strategy: Strategy = "strategy" (e.g. "\"lock\""),
        ttl: Ttl = "ttl" (e.g. "\"24h\""),
        lease: Lease = "lease" (e.g. "\"30s\""),
        wait: Duration = "wait" (e.g. "\"10s\""),
        on_duplicate: OnDuplicate = "on_duplicate" (e.g. "\"reject\""),
        fingerprint: ParamList = "fingerprint" (e.g. "[order, cents]"),
        cache_err: bool = "cache_err" (e.g. "true"),
        transaction: Transaction = "transaction" (e.g. "tx"),
        idem: RuntimeExpr = "idem" (e.g. "self.idem"),
        recover: Flag = "recover" (e.g. "true"),
        context: ParamList = "context" (e.g. "[pool, gateway]"),
        krate: CratePath = "crate" (e.g. "\"::idem_runtime\""),
    }
}

/// The option names, for the test that the docs' table lists the same.
#[cfg(test)]
pub(crate) const OPTIONS: &[&str] = <Given as Options>::NAMES;

// No defaults here: an option the user did not write is left out of the expansion, so
// the runtime's own defaults (`idem_runtime::options::DEFAULT_TTL`, `DEFAULT_LEASE`,
// `DEFAULT_WAIT`, and each strategy's duplicate policy in `Options::dedup`/`token`)
// apply, and the two cannot drift apart.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Dedup,
    Lock,
    Token,
}

impl Value for Strategy {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        choice(
            input,
            option,
            &[
                ("dedup", Strategy::Dedup),
                ("lock", Strategy::Lock),
                ("token", Strategy::Token),
            ],
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OnDuplicate {
    Replay,
    Reject,
}

impl Value for OnDuplicate {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        choice(
            input,
            option,
            &[
                ("replay", OnDuplicate::Replay),
                ("reject", OnDuplicate::Reject),
            ],
        )
    }
}

/// `ttl = "24h"`, above zero: a zero ttl keeps no record.
struct Ttl(u64);

impl Value for Ttl {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        positive(input, option, "keeps no record").map(Ttl)
    }
}

/// `lease = "30s"`, at least [`MIN_LEASE_MS`]: a zero lease expires at once, and a
/// shorter one cannot be kept by the heartbeat.
struct Lease(u64);

/// The shortest lease the heartbeat keeps: it renews every third of the lease, and a
/// renewal a few milliseconds late (tokio's timer, a busy executor, a store round trip)
/// loses a shorter one while the body still runs, so a twin runs beside it. The same
/// floor as the runtime's `idem_runtime::options::MIN_LEASE` (100 ms), which refuses it at run
/// time; this refuses it at compile time, at the literal.
const MIN_LEASE_MS: u64 = 100;

impl Value for Lease {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        let fork = input.fork();
        let millis = positive(input, option, "expires at once")?;
        if millis < MIN_LEASE_MS {
            let lit: syn::LitStr = fork.parse()?;
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`lease = {:?}` is below the {MIN_LEASE_MS}ms floor: the heartbeat \
                     renews the lease every third of it while the body runs and cannot \
                     keep one shorter, so a duplicate would run beside the body; write \
                     lease = \"{MIN_LEASE_MS}ms\" or more (the lease only decides how soon \
                     a crashed holder's key is taken over)",
                    lit.value()
                ),
            ));
        }
        Ok(Lease(millis))
    }
}

/// The milliseconds of a duration that must be above zero; `zero` says what a zero one
/// would do.
fn positive(input: ParseStream<'_>, option: &Decl, zero: &str) -> syn::Result<u64> {
    let duration = Duration::parse(input, option)?;
    if duration.millis == 0 {
        let Decl { name, example } = option;
        return Err(syn::Error::new(
            duration.lit.span(),
            format!(
                "`{name}` must be greater than zero (a zero {name} {zero}), e.g. {name} = {example}"
            ),
        ));
    }
    Ok(duration.millis)
}

/// `fingerprint = [order, cents]`: distinct names, at least one.
struct ParamList(Vec<Ident>);

impl Value for ParamList {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        let Decl { name, example } = option;
        if !input.peek(syn::token::Bracket) {
            return Err(input.error(format!(
                "`{name}` takes a list of argument names, e.g. {name} = {example}"
            )));
        }
        let content;
        let brackets = bracketed!(content in input);
        // `Ident::parse_any` so that `self` can be fingerprinted in a method.
        let list = Punctuated::<Ident, Token![,]>::parse_terminated_with(&content, |input| {
            input.call(Ident::parse_any)
        })?;
        if list.is_empty() {
            return Err(syn::Error::new(
                brackets.span.join(),
                format!(
                    "the {name} lists no argument; name the arguments to hash, \
                     e.g. {name} = {example}, or remove the option"
                ),
            ));
        }
        let mut args: Vec<Ident> = Vec::new();
        let mut errors = Errors::default();
        for ident in list {
            if args.contains(&ident) {
                errors.push(syn::Error::new(
                    ident.span(),
                    format!("`{ident}` is listed twice in the {name}; remove one"),
                ));
            } else {
                args.push(ident);
            }
        }
        errors.finish()?;
        Ok(ParamList(args))
    }
}

/// `transaction = tx`: the parameter carrying the caller's open SQL transaction.
struct Transaction(Ident);

impl Value for Transaction {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        let Decl { name, example } = option;
        let param = input.call(Ident::parse_any).map_err(|_| {
            input.error(format!(
                "`{name}` names the parameter that carries the open transaction, \
                 e.g. {name} = {example}"
            ))
        })?;
        Ok(Transaction(param))
    }
}

/// `idem = self.idem`: an expression giving the runtime (`Idem` or `&Idem`) the call
/// uses instead of the current one; it may read the parameters.
struct RuntimeExpr(syn::Expr);

impl Value for RuntimeExpr {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        let Decl { name, example } = option;
        let expr: syn::Expr = input.parse().map_err(|_| {
            input.error(format!(
                "`{name}` takes an expression giving the runtime, an `Idem` or `&Idem`, \
                 e.g. {name} = {example} or {name} = &state.idem"
            ))
        })?;
        Ok(RuntimeExpr(expr))
    }
}

/// The checked options. The durations and the policy are `Some` only where the user
/// wrote them; the rest are the runtime's defaults.
struct Config {
    key: Template,
    strategy: Strategy,
    ttl_ms: Option<u64>,
    lease_ms: Option<u64>,
    wait_ms: Option<u64>,
    /// The policy as written.
    on_duplicate_given: Option<OnDuplicate>,
    /// The policy in effect, which picks the codec: the one written, else the
    /// strategy's default (replay for dedup, reject for token); `None` for a lock.
    on_duplicate: Option<OnDuplicate>,
    cache_err: bool,
    fingerprint: Vec<Ident>,
    /// The parameter carrying the caller's open transaction (transactional mode).
    transaction: Option<Ident>,
    /// The runtime named by the function (`idem = ...`); else the current one.
    idem: Option<syn::Expr>,
    /// `recover`: the arguments are recorded, and a recoverer may finish the call.
    recover: bool,
    /// The parameters a recoverer provides by type (`context = [...]`).
    context: Vec<Ident>,
    private: Private,
}

impl Config {
    /// Parses the attribute's arguments, then checks the cross-option rules. Errors in
    /// separate options are all reported; the configuration is still built when the
    /// options that were understood allow it, so that the key can be checked against the
    /// signature in the same build.
    fn parse(args: TokenStream, errors: &mut Errors) -> Option<Config> {
        let parsed =
            parse_options::<Given>(args, errors, |name| unknown_option(name, Given::NAMES));
        // A `key` that was written but did not parse has its own error already.
        let key_failed = parsed.failed("key");
        build(parsed.options, key_failed)
            .map_err(|error| errors.push(error))
            .ok()
            .flatten()
    }
}

/// The rules that involve several options, and the defaults. `Ok(None)`: the key failed
/// to parse, and its error is reported already.
fn build(given: Given, key_failed: bool) -> syn::Result<Option<Config>> {
    let mut errors = Errors::default();
    let strategy = given.strategy.as_ref().map_or(Strategy::Dedup, |s| s.value);
    if strategy == Strategy::Lock {
        let mut not_for_lock = |span: Option<Span>, option: &str, why: &str| {
            if let Some(span) = span {
                errors.push(syn::Error::new(
                    span,
                    format!(
                        "`{option}` does not apply to strategy = \"lock\": {why}; remove it, \
                         or use strategy = \"dedup\" to run once and replay"
                    ),
                ));
            }
        };
        let no_record = "a lock stores no result";
        not_for_lock(given.ttl.as_ref().map(|a| a.name), "ttl", no_record);
        not_for_lock(
            given.on_duplicate.as_ref().map(|a| a.name),
            "on_duplicate",
            "a lock lets every call run, one at a time",
        );
        not_for_lock(
            given.cache_err.as_ref().map(|a| a.name),
            "cache_err",
            no_record,
        );
        not_for_lock(
            given.fingerprint.as_ref().map(|a| a.name),
            "fingerprint",
            no_record,
        );
    }
    crate::recover::check_options(
        given.recover.as_ref().filter(|a| a.value.0).map(|a| a.name),
        strategy == Strategy::Dedup,
        strategy == Strategy::Lock,
        given.transaction.as_ref().map(|a| a.name),
        given.context.as_ref().map(|a| a.name),
        &mut errors,
    );
    if let Some(arg) = &given.transaction {
        if strategy != Strategy::Dedup {
            errors.push(syn::Error::new(
                arg.name,
                "`transaction` applies to strategy = \"dedup\" only: the record is \
                 written in the caller's transaction and commits with its writes",
            ));
        }
        if let Some(cache) = given.cache_err.as_ref().filter(|a| a.value) {
            errors.push(syn::Error::new(
                cache.name,
                "`cache_err` does not apply with `transaction`: an `Err` rolls the \
                 body's writes back to before the call, so there is no result to keep; \
                 remove it",
            ));
        }
    }
    if let (Strategy::Token, Some(key)) = (strategy, &given.key)
        && !key.value.is_single_placeholder()
    {
        errors.push(syn::Error::new(
            key.value.lit.span(),
            "with strategy = \"token\" the key is the token itself, as returned by \
             issue_token; name the argument that carries it and nothing else, \
             e.g. key = \"{token}\"",
        ));
    }
    let key = match given.key {
        Some(key) => Some(key.value),
        None if key_failed => None,
        None => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key`: name what identifies one operation, \
                 e.g. #[idempotent(key = \"charge:{order.id}\")]",
            ));
            None
        }
    };
    errors.finish()?;
    let Some(key) = key else { return Ok(None) };
    let on_duplicate = given.on_duplicate.map(|a| a.value);
    Ok(Some(Config {
        key,
        strategy,
        // `build` refused a `ttl` or an `on_duplicate` on a lock.
        ttl_ms: given.ttl.map(|a| a.value.0),
        lease_ms: given.lease.map(|a| a.value.0),
        wait_ms: given.wait.map(|a| a.value.millis),
        on_duplicate_given: on_duplicate,
        on_duplicate: match strategy {
            Strategy::Lock => None,
            Strategy::Dedup => Some(on_duplicate.unwrap_or(OnDuplicate::Replay)),
            Strategy::Token => Some(on_duplicate.unwrap_or(OnDuplicate::Reject)),
        },
        cache_err: given.cache_err.is_some_and(|a| a.value),
        fingerprint: given.fingerprint.map(|a| a.value.0).unwrap_or_default(),
        transaction: given.transaction.map(|a| a.value.0),
        idem: given.idem.map(|a| a.value.0),
        recover: given.recover.is_some_and(|a| a.value.0),
        context: given.context.map(|a| a.value.0).unwrap_or_default(),
        // A wrong `crate` path is then reported at the literal.
        private: Private::new(given.krate),
    }))
}

/// Expands `#[idempotent(args)] item`. On any error the original item is emitted next to
/// the errors, so an editor still sees the function.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    on_fn(
        item,
        "#[idempotent] goes on an `async fn` with a body returning `Result<T, E>`",
        |func| expand_fn(args, func),
        ToTokens::to_token_stream,
    )
}

fn expand_fn(args: TokenStream, func: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let config = Config::parse(args, &mut errors);
    let sig = &func.sig;
    require_async(
        sig,
        ATTRIBUTE,
        "the body runs as a future under the runtime's claim",
        &mut errors,
    );
    let result = ResultType::of(
        sig,
        "#[idempotent] needs the return type written as `Result<T, E>` (or an alias of it \
         whose name ends in `Result`), where `T` is the value a duplicate gets back and \
         `E: From<idem_runtime::Error>` carries idem's own errors",
    )
    .map_err(|e| errors.push(e))
    .ok();
    if let Some(config) = &config {
        let mut named: Vec<(&Ident, &str)> = Vec::new();
        named.extend(config.transaction.iter().map(|tx| (tx, "`transaction`")));
        named.extend(
            config
                .fingerprint
                .iter()
                .map(|entry| (entry, "the fingerprint")),
        );
        named.extend(config.context.iter().map(|entry| (entry, "`context`")));
        check_references(func, &config.key, &named, &mut errors);
    }
    let recover = config
        .as_ref()
        .filter(|c| c.recover)
        .and_then(|c| Recover::check(func, &c.context, &mut errors));
    errors.finish()?;
    match (config, result) {
        (Some(config), Some(result)) => Ok(rewrite(func, &config, &result, recover.as_ref())),
        // Both were parsed or an error was returned above.
        _ => Err(internal(ATTRIBUTE)),
    }
}

/// Whether a type's tokens name a lifetime or a reference.
fn borrows(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Punct(p) => p.as_char() == '\'' || p.as_char() == '&',
        proc_macro2::TokenTree::Group(g) => borrows(g.stream()),
        _ => false,
    })
}

fn rewrite(
    func: &ItemFn,
    config: &Config,
    result: &ResultType<'_>,
    recover: Option<&Recover<'_>>,
) -> TokenStream {
    let ret_ty = result.whole;
    // One `use` names the runtime's private module; every other path goes through it.
    let import = config.private.import();
    let private = Private::alias();
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        .. // syn 3's `modifiers` (`default fn`): not valid on a free fn, nothing to carry over.
    } = func;

    // Locals get mixed-site hygiene: the user's body cannot see or shadow them.
    let rt = Ident::new("__idem_rt", Span::mixed_site());
    let key = Ident::new("__idem_key", Span::mixed_site());
    let fp = Ident::new("__idem_fp", Span::mixed_site());
    let builder = Ident::new("__idem_builder", Span::mixed_site());
    let error = Ident::new("__idem_error", Span::mixed_site());
    let ret = Ident::new("__idem_ret", Span::mixed_site());
    let options = format_ident!("__IDEM_OPTIONS");
    // The runtime: the one the function names, evaluated before the body takes its
    // arguments (so it may borrow them), else the current one.
    let runtime = match &config.idem {
        Some(expr) => {
            // All at the expression, so a wrong type is reported there alone.
            let at = expr.span();
            let (private_at, given) = (Private::alias_at(at), Ident::new("given", at));
            quote_spanned!(at=> #private_at::#given(&(#expr)))
        }
        None => quote!(#private::current()),
    };

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
    // Only what the user wrote; the constructor carries the runtime's defaults.
    if let Some(ttl) = config.ttl_ms {
        let ttl = millis(ttl);
        spec.extend(quote!(.ttl(#ttl)));
    }
    if let Some(lease) = config.lease_ms {
        let lease = millis(lease);
        spec.extend(quote!(.lease(#lease)));
    }
    if let Some(wait) = config.wait_ms {
        let wait = millis(wait);
        spec.extend(quote!(.wait(#wait)));
    }
    match config.on_duplicate_given {
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

    let fingerprint = if !codec {
        // A lock has no record to compare a fingerprint with (`build` rejects one).
        TokenStream::new()
    } else if config.fingerprint.is_empty() {
        quote!(let #fp = ::core::option::Option::None;)
    } else {
        let adds = config.fingerprint.iter().map(|arg| {
            // Spanned at the entry, so a non-`Serialize` argument is reported there, once,
            // by the assertion (see the runtime's `__private::bounds`).
            let private_at = Private::alias_at(arg.span());
            quote_spanned! {arg.span()=>
                #private_at::fingerprinted(&#arg);
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
    let private_at = Private::alias_at(at);
    // The bounds on the user's types, asserted first and at the return type, so that an
    // unmet one is one error there that says what to write (see the runtime's
    // `__private::bounds`); the same failure found later in the runtime calls, at the
    // same span, is then not reported again.
    let returns = quote_spanned!(at=> ::core::marker::PhantomData::<#ret_ty>);
    let mut bounds = quote_spanned!(at=> #private_at::carries_idem_errors(#returns););
    if codec && replays {
        bounds.extend(quote_spanned!(at=> #private_at::replayable_ok(#returns);));
        if config.cache_err {
            bounds.extend(quote_spanned!(at=> #private_at::replayable_err(#returns);));
        }
    }
    if let Some(recover) = recover {
        bounds.extend(recover.bounds(&returns, at));
    }
    let constructor_at = Ident::new(&constructor.to_string(), at);
    // Replays by clone on an in-process store when the `Ok` type allows it; decided by
    // method lookup on a probe (see `idem_runtime::codec::CloneReplay`), so no bound is added
    // to the function. A type with borrowed parts is left out: lookup ignores lifetimes,
    // so the probe would pick the clone path and then fail the `'static` it needs.
    let reuse = format_ident!("__idem_reuse");
    let replay_now = match result.ok() {
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
        let args = match recover {
            Some(recover) => {
                let args = recover.args(&key);
                quote!(#rt, &#options, #key, #fp, #args, #reuse, #body)
            }
            None => quote!(#rt, &#options, #key, #fp, #reuse, #body),
        };
        (quote_spanned!(at=> <#private_at::#codec, _, _, _>), args)
    } else {
        (
            quote_spanned!(at=> <_, _, _>),
            quote!(#rt, &#options, #key, #body),
        )
    };
    let mut args = Group::new(Delimiter::Parenthesis, args);
    args.set_span(at);
    let constructor_at = match recover {
        Some(_) => Ident::new("dedup_recoverable", at),
        None => constructor_at,
    };
    let call = quote_spanned!(at=> #private_at::#constructor_at::#generics #args .await);
    let entry = recover.map(|r| r.entry(&sig.ident, &options));

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
        let span = format_ident!("__idem_span");
        return quote! {
            #(#attrs)*
            #vis #sig {
                #import
                #bounds
                static #options: #private::Options = #spec;
                let #rt = #runtime;
                let #key = #rt.key_parts(&#options, |#writer| #key_parts);
                #fingerprint
                // The claim, the body and the record run in the call's `idem` span, as
                // every other path's do.
                let #span = #private::tx_span(&#options, &#key);
                #private::Instrument::instrument(async {
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
                        #private_at::#end_at::<#private_at::#codec, _, _, _>(
                            &#rt, &#options, #claim, #conn, &#ret,
                        ).await
                    {
                        return ::core::result::Result::Err(::core::convert::From::from(#error));
                    }
                    #ret
                }, #span).await
            }
        };
    }

    quote! {
        #(#attrs)*
        #vis #sig {
            #import
            #bounds
            static #options: #private::Options = #spec;
            #entry
            let #rt = #runtime;
            let #key = #rt.key_parts(&#options, |#writer| #key_parts);
            #fingerprint
            #replay_now
            #call
        }
    }
}
