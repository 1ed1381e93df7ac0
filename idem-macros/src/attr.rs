//! Parsing `#[idempotent(...)]`: one small type per option, a `Configuration` that takes
//! each option once, and `build()` for the rules that involve several options.
//!
//! The argument list is split at its top-level commas and every option is parsed on its
//! own, so one malformed option does not hide the mistakes in the others: the user sees
//! all of them in one build.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Ident, LitBool, LitStr, Token, bracketed};

use crate::key::Template;

pub(crate) mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(strategy);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(on_duplicate);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(cache_err);
    syn::custom_keyword!(transaction);
}

const OPTIONS: &[&str] = &[
    "key",
    "strategy",
    "ttl",
    "lease",
    "wait",
    "on_duplicate",
    "fingerprint",
    "cache_err",
    "transaction",
    "crate",
];

const DAY_MS: u64 = 24 * 3600 * 1000;
const DEFAULT_TTL_MS: u64 = DAY_MS;
const DEFAULT_LEASE_MS: u64 = 30_000;
const DEFAULT_WAIT_MS: u64 = 10_000;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    Dedup,
    Lock,
    Token,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDuplicate {
    Replay,
    Reject,
}

/// `key = "charge:{order.id}"`
pub(crate) struct KeyArg {
    kw: Span,
    template: Template,
}

/// `strategy = "lock"`
pub(crate) struct StrategyArg {
    kw: Span,
    value: Strategy,
}

/// `ttl = "24h"`, `lease = "30s"`, `wait = "10s"`
pub(crate) struct DurationArg {
    kw: Span,
    millis: u64,
}

/// `on_duplicate = "reject"`
pub(crate) struct OnDuplicateArg {
    kw: Span,
    value: OnDuplicate,
}

/// `fingerprint = [order, cents]`
pub(crate) struct FingerprintArg {
    kw: Span,
    args: Vec<Ident>,
}

/// `cache_err = true`
pub(crate) struct CacheErrArg {
    kw: Span,
    value: bool,
}

/// `transaction = tx`: the parameter carrying the caller's open SQL transaction.
pub(crate) struct TransactionArg {
    kw: Span,
    param: Ident,
}

/// `crate = "path::to::idem_runtime"`
pub(crate) struct CrateArg {
    kw: Span,
    lit: Span,
    path: syn::Path,
}

enum Arg {
    Key(KeyArg),
    Strategy(StrategyArg),
    Ttl(DurationArg),
    Lease(DurationArg),
    Wait(DurationArg),
    OnDuplicate(OnDuplicateArg),
    Fingerprint(FingerprintArg),
    CacheErr(CacheErrArg),
    Transaction(TransactionArg),
    Crate(CrateArg),
}

/// `= "..."`; `example` is shown when the value is not a string literal.
pub(crate) fn parse_eq_str(
    input: ParseStream<'_>,
    option: &str,
    example: &str,
) -> syn::Result<LitStr> {
    input.parse::<Token![=]>()?;
    if input.peek(LitStr) {
        return input.parse();
    }
    Err(input.error(format!(
        "`{option}` takes a string literal, e.g. {option} = {example}"
    )))
}

impl KeyArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        let lit = parse_eq_str(input, "key", "\"charge:{order.id}\"")?;
        Ok(KeyArg {
            kw,
            template: Template::parse(lit)?,
        })
    }
}

impl StrategyArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        let lit = parse_eq_str(input, "strategy", "\"lock\"")?;
        let value = match lit.value().as_str() {
            "dedup" => Strategy::Dedup,
            "lock" => Strategy::Lock,
            "token" => Strategy::Token,
            other => {
                return Err(unknown_value(
                    &lit,
                    "strategy",
                    other,
                    &["dedup", "lock", "token"],
                ));
            }
        };
        Ok(StrategyArg { kw, value })
    }
}

impl OnDuplicateArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        let lit = parse_eq_str(input, "on_duplicate", "\"reject\"")?;
        let value = match lit.value().as_str() {
            "replay" => OnDuplicate::Replay,
            "reject" => OnDuplicate::Reject,
            other => {
                return Err(unknown_value(
                    &lit,
                    "on_duplicate",
                    other,
                    &["replay", "reject"],
                ));
            }
        };
        Ok(OnDuplicateArg { kw, value })
    }
}

impl DurationArg {
    /// `what` names the option in messages; `allow_zero` is false where zero makes the
    /// option meaningless (a zero lease expires at once, a zero ttl keeps nothing).
    fn parse_value(
        kw: Span,
        what: &str,
        allow_zero: bool,
        input: ParseStream<'_>,
    ) -> syn::Result<Self> {
        let example = match what {
            "ttl" => "\"24h\"",
            "lease" => "\"30s\"",
            _ => "\"10s\"",
        };
        let lit = parse_eq_str(input, what, example)?;
        let millis = duration_millis(&lit, what)?;
        if millis == 0 && !allow_zero {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`{what}` must be greater than zero (a zero {what} {}), e.g. {what} = {example}",
                    if what == "ttl" {
                        "keeps no record"
                    } else {
                        "expires at once"
                    }
                ),
            ));
        }
        Ok(DurationArg { kw, millis })
    }
}

/// The milliseconds of a duration literal, or an error at the literal that says how to
/// write one; `what` names the option.
pub(crate) fn duration_millis(lit: &LitStr, what: &str) -> syn::Result<u64> {
    parse_millis(&lit.value()).ok_or_else(|| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid duration {:?} for `{what}`; write an integer followed by a unit \
                 (ms, s, m, h or d), e.g. \"250ms\", \"30s\", \"5m\", \"24h\", \"7d\"",
                lit.value()
            ),
        )
    })
}

/// Milliseconds in `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`; `None` if malformed or
/// if it does not fit in a `u64` of milliseconds.
pub(crate) fn parse_millis(text: &str) -> Option<u64> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return None;
    }
    let number: u64 = number.parse().ok()?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60 * 1000,
        "h" => 3600 * 1000,
        "d" => DAY_MS,
        _ => return None,
    };
    number.checked_mul(scale)
}

impl FingerprintArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        input.parse::<Token![=]>()?;
        if !input.peek(syn::token::Bracket) {
            return Err(input.error(
                "`fingerprint` takes a list of argument names, e.g. fingerprint = [order, cents]",
            ));
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
                "the fingerprint lists no argument; name the arguments to hash, \
                 e.g. fingerprint = [order, cents], or remove the option",
            ));
        }
        let mut args: Vec<Ident> = Vec::new();
        let mut errors = Errors::default();
        for ident in list {
            if args.contains(&ident) {
                errors.push(syn::Error::new(
                    ident.span(),
                    format!("`{ident}` is listed twice in the fingerprint; remove one"),
                ));
            } else {
                args.push(ident);
            }
        }
        errors.finish()?;
        Ok(FingerprintArg { kw, args })
    }
}

impl TransactionArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        input.parse::<Token![=]>()?;
        let param = input.call(Ident::parse_any).map_err(|_| {
            input.error(
                "`transaction` names the parameter that carries the open transaction, \
                 e.g. transaction = tx",
            )
        })?;
        Ok(TransactionArg { kw, param })
    }
}

impl CacheErrArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        input.parse::<Token![=]>()?;
        if !input.peek(LitBool) {
            return Err(input.error("`cache_err` takes `true` or `false`, e.g. cache_err = true"));
        }
        let lit: LitBool = input.parse()?;
        Ok(CacheErrArg {
            kw,
            value: lit.value,
        })
    }
}

impl CrateArg {
    pub(crate) fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        let lit = parse_eq_str(input, "crate", "\"::idem_runtime\"")?;
        let path = lit.parse::<syn::Path>().map_err(|_| {
            syn::Error::new(
                lit.span(),
                format!(
                    "{:?} is not a path; write the path of the idem runtime crate, \
                     e.g. crate = \"::idem_runtime\"",
                    lit.value()
                ),
            )
        })?;
        Ok(CrateArg {
            kw,
            lit: lit.span(),
            path,
        })
    }

    /// The `crate` keyword, where a duplicate is reported.
    pub(crate) fn kw(&self) -> Span {
        self.kw
    }

    /// `#path::__private` and the span to report a wrong path at; the default without
    /// the option.
    pub(crate) fn private(arg: Option<CrateArg>) -> (TokenStream, Span) {
        match arg {
            Some(arg) => {
                let path = arg.path;
                (quote_spanned!(arg.lit=> #path::__private), arg.lit)
            }
            None => (quote!(::idem_runtime::__private), Span::call_site()),
        }
    }
}

impl Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.peek(kw::key) {
            let kw: kw::key = input.parse()?;
            KeyArg::parse_value(kw.span, input).map(Arg::Key)
        } else if input.peek(kw::strategy) {
            let kw: kw::strategy = input.parse()?;
            StrategyArg::parse_value(kw.span, input).map(Arg::Strategy)
        } else if input.peek(kw::ttl) {
            let kw: kw::ttl = input.parse()?;
            DurationArg::parse_value(kw.span, "ttl", false, input).map(Arg::Ttl)
        } else if input.peek(kw::lease) {
            let kw: kw::lease = input.parse()?;
            DurationArg::parse_value(kw.span, "lease", false, input).map(Arg::Lease)
        } else if input.peek(kw::wait) {
            let kw: kw::wait = input.parse()?;
            DurationArg::parse_value(kw.span, "wait", true, input).map(Arg::Wait)
        } else if input.peek(kw::on_duplicate) {
            let kw: kw::on_duplicate = input.parse()?;
            OnDuplicateArg::parse_value(kw.span, input).map(Arg::OnDuplicate)
        } else if input.peek(kw::fingerprint) {
            let kw: kw::fingerprint = input.parse()?;
            FingerprintArg::parse_value(kw.span, input).map(Arg::Fingerprint)
        } else if input.peek(kw::cache_err) {
            let kw: kw::cache_err = input.parse()?;
            CacheErrArg::parse_value(kw.span, input).map(Arg::CacheErr)
        } else if input.peek(kw::transaction) {
            let kw: kw::transaction = input.parse()?;
            TransactionArg::parse_value(kw.span, input).map(Arg::Transaction)
        } else if input.peek(Token![crate]) {
            let kw: Token![crate] = input.parse()?;
            CrateArg::parse_value(kw.span, input).map(Arg::Crate)
        } else {
            let name = input.call(Ident::parse_any)?;
            Err(unknown_option(&name, OPTIONS))
        }
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

pub(crate) fn unknown_value(lit: &LitStr, option: &str, value: &str, valid: &[&str]) -> syn::Error {
    let listed: Vec<String> = valid.iter().map(|v| format!("\"{v}\"")).collect();
    syn::Error::new(
        lit.span(),
        format!(
            "unknown {option} \"{value}\"{}; valid values are: {}",
            did_you_mean(value, valid),
            listed.join(", ")
        ),
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

/// The options as given, each at most once.
#[derive(Default)]
pub(crate) struct Configuration {
    key: Option<KeyArg>,
    strategy: Option<StrategyArg>,
    ttl: Option<DurationArg>,
    lease: Option<DurationArg>,
    wait: Option<DurationArg>,
    on_duplicate: Option<OnDuplicateArg>,
    fingerprint: Option<FingerprintArg>,
    cache_err: Option<CacheErrArg>,
    transaction: Option<TransactionArg>,
    krate: Option<CrateArg>,
    /// Set when a `key = ...` was written but did not parse, so that its own error is
    /// reported instead of a misleading "missing `key`".
    key_attempted: bool,
}

pub(crate) fn set_once<T>(
    slot: &mut Option<T>,
    value: T,
    name: &str,
    span: Span,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("`{name}` is given twice; keep one"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl Configuration {
    pub(crate) fn set_key(&mut self, arg: KeyArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.key, arg, "key", span)
    }
    pub(crate) fn set_strategy(&mut self, arg: StrategyArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.strategy, arg, "strategy", span)
    }
    pub(crate) fn set_ttl(&mut self, arg: DurationArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.ttl, arg, "ttl", span)
    }
    pub(crate) fn set_lease(&mut self, arg: DurationArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.lease, arg, "lease", span)
    }
    pub(crate) fn set_wait(&mut self, arg: DurationArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.wait, arg, "wait", span)
    }
    pub(crate) fn set_on_duplicate(&mut self, arg: OnDuplicateArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.on_duplicate, arg, "on_duplicate", span)
    }
    pub(crate) fn set_fingerprint(&mut self, arg: FingerprintArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.fingerprint, arg, "fingerprint", span)
    }
    pub(crate) fn set_cache_err(&mut self, arg: CacheErrArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.cache_err, arg, "cache_err", span)
    }
    pub(crate) fn set_transaction(&mut self, arg: TransactionArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.transaction, arg, "transaction", span)
    }
    pub(crate) fn set_crate(&mut self, arg: CrateArg) -> syn::Result<()> {
        let span = arg.kw;
        set_once(&mut self.krate, arg, "crate", span)
    }

    fn set(&mut self, arg: Arg) -> syn::Result<()> {
        match arg {
            Arg::Key(a) => self.set_key(a),
            Arg::Strategy(a) => self.set_strategy(a),
            Arg::Ttl(a) => self.set_ttl(a),
            Arg::Lease(a) => self.set_lease(a),
            Arg::Wait(a) => self.set_wait(a),
            Arg::OnDuplicate(a) => self.set_on_duplicate(a),
            Arg::Fingerprint(a) => self.set_fingerprint(a),
            Arg::CacheErr(a) => self.set_cache_err(a),
            Arg::Transaction(a) => self.set_transaction(a),
            Arg::Crate(a) => self.set_crate(a),
        }
    }

    /// Parses the attribute's arguments, then checks the cross-option rules. Errors in
    /// separate options are all reported; the configuration is still built when the
    /// options that were understood allow it, so that the key can be checked against the
    /// signature in the same build.
    pub(crate) fn parse(args: TokenStream, errors: &mut Errors) -> Option<Config> {
        let mut config = Configuration::default();
        let failed = parse_options(args, errors, Arg::parse, |arg| config.set(arg));
        config.key_attempted = failed.iter().any(|name| name == "key");
        config
            .build()
            .map_err(|error| errors.push(error))
            .ok()
            .flatten()
    }

    /// The rules that involve several options, and the defaults.
    pub(crate) fn build(self) -> syn::Result<Option<Config>> {
        let mut errors = Errors::default();
        let strategy = self.strategy.as_ref().map_or(Strategy::Dedup, |s| s.value);
        if strategy == Strategy::Lock {
            let not_for_lock = |span: Span, option: &str, why: &str| {
                syn::Error::new(
                    span,
                    format!(
                        "`{option}` does not apply to strategy = \"lock\": {why}; remove it, \
                         or use strategy = \"dedup\" to run once and replay"
                    ),
                )
            };
            let no_record = "a lock stores no result";
            if let Some(arg) = &self.ttl {
                errors.push(not_for_lock(arg.kw, "ttl", no_record));
            }
            if let Some(arg) = &self.on_duplicate {
                errors.push(not_for_lock(
                    arg.kw,
                    "on_duplicate",
                    "a lock lets every call run, one at a time",
                ));
            }
            if let Some(arg) = &self.cache_err {
                errors.push(not_for_lock(arg.kw, "cache_err", no_record));
            }
            if let Some(arg) = &self.fingerprint {
                errors.push(not_for_lock(arg.kw, "fingerprint", no_record));
            }
        }
        if let Some(arg) = &self.transaction {
            if strategy != Strategy::Dedup {
                errors.push(syn::Error::new(
                    arg.kw,
                    "`transaction` applies to strategy = \"dedup\" only: the record is \
                     written in the caller's transaction and commits with its writes",
                ));
            }
            if let Some(cache) = self.cache_err.as_ref().filter(|a| a.value) {
                errors.push(syn::Error::new(
                    cache.kw,
                    "`cache_err` does not apply with `transaction`: an `Err` rolls the \
                     body's writes back to before the call, so there is no result to keep; \
                     remove it",
                ));
            }
        }
        if let (Strategy::Token, Some(key)) = (strategy, &self.key)
            && !key.template.is_single_placeholder()
        {
            errors.push(syn::Error::new(
                key.template.lit.span(),
                "with strategy = \"token\" the key is the token itself, as returned by \
                 issue_token; name the argument that carries it and nothing else, \
                 e.g. key = \"{token}\"",
            ));
        }
        let key = match self.key {
            Some(key) => Some(key.template),
            None if self.key_attempted => None,
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
        // `None`: the key failed to parse and its error was collected by `parse`.
        let Some(key) = key else { return Ok(None) };
        let on_duplicate = match strategy {
            Strategy::Lock => None,
            Strategy::Dedup => Some(self.on_duplicate.map_or(OnDuplicate::Replay, |a| a.value)),
            Strategy::Token => Some(self.on_duplicate.map_or(OnDuplicate::Reject, |a| a.value)),
        };
        Ok(Some(Config {
            key,
            strategy,
            ttl_ms: match strategy {
                Strategy::Lock => None,
                _ => Some(self.ttl.map_or(DEFAULT_TTL_MS, |a| a.millis)),
            },
            lease_ms: self.lease.map_or(DEFAULT_LEASE_MS, |a| a.millis),
            wait_ms: self.wait.map_or(DEFAULT_WAIT_MS, |a| a.millis),
            on_duplicate,
            cache_err: self.cache_err.is_some_and(|a| a.value),
            fingerprint: self.fingerprint.map(|a| a.args).unwrap_or_default(),
            transaction: self.transaction.map(|a| a.param),
            // A wrong `crate` path is then reported at the literal.
            private: CrateArg::private(self.krate),
        }))
    }
}

/// The checked options with defaults filled in.
pub(crate) struct Config {
    pub(crate) key: Template,
    pub(crate) strategy: Strategy,
    /// `None` for a lock, which stores no record.
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) lease_ms: u64,
    pub(crate) wait_ms: u64,
    /// `None` for a lock.
    pub(crate) on_duplicate: Option<OnDuplicate>,
    pub(crate) cache_err: bool,
    pub(crate) fingerprint: Vec<Ident>,
    /// The parameter carrying the caller's open transaction (transactional mode).
    pub(crate) transaction: Option<Ident>,
    /// `::idem_runtime::__private`, or the `crate` option's path to it, and the span to
    /// report it at.
    pub(crate) private: (TokenStream, Span),
}

/// Parses an attribute's comma-separated options one by one with `parse`, handing each
/// to `set`; every error is collected. Returns the names of the options that were
/// written but failed to parse, so that a "missing option" error is not reported for
/// them on top of their own.
pub(crate) fn parse_options<A>(
    args: TokenStream,
    errors: &mut Errors,
    parse: fn(ParseStream<'_>) -> syn::Result<A>,
    mut set: impl FnMut(A) -> syn::Result<()>,
) -> Vec<String> {
    let mut failed = Vec::new();
    for chunk in split_at_commas(args) {
        let Some(first) = chunk.tokens.clone().into_iter().next() else {
            // `a,,b`: a stray comma. A trailing comma leaves no chunk at all.
            errors.push(syn::Error::new(
                chunk.comma,
                "expected an option before this comma",
            ));
            continue;
        };
        match parse.parse2(chunk.tokens) {
            Ok(arg) => {
                if let Err(error) = set(arg) {
                    errors.push(error);
                }
            }
            Err(error) => {
                if let TokenTree::Ident(ident) = &first {
                    failed.push(ident.to_string());
                }
                errors.push(error);
            }
        }
    }
    failed
}

impl Config {
    /// A configuration that carries only `key`, so that another attribute's key template
    /// is checked against the signature by exactly the rules of `#[idempotent]`
    /// (`expand::check_references`).
    pub(crate) fn key_only(key: Template) -> Config {
        Config {
            key,
            strategy: Strategy::Dedup,
            ttl_ms: None,
            lease_ms: DEFAULT_LEASE_MS,
            wait_ms: DEFAULT_WAIT_MS,
            on_duplicate: None,
            cache_err: false,
            fingerprint: Vec::new(),
            transaction: None,
            private: CrateArg::private(None),
        }
    }
}

struct Chunk {
    tokens: TokenStream,
    /// The comma that ends this chunk, or the call site for the last one.
    comma: Span,
}

fn split_at_commas(args: TokenStream) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let mut current = TokenStream::new();
    for tree in args {
        match &tree {
            TokenTree::Punct(p) if p.as_char() == ',' => {
                chunks.push(Chunk {
                    tokens: std::mem::take(&mut current),
                    comma: p.span(),
                });
            }
            _ => current.extend([tree]),
        }
    }
    if !current.is_empty() {
        chunks.push(Chunk {
            tokens: current,
            comma: Span::call_site(),
        });
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_millis("250ms"), Some(250));
        assert_eq!(parse_millis("30s"), Some(30_000));
        assert_eq!(parse_millis("5m"), Some(300_000));
        assert_eq!(parse_millis("24h"), Some(DAY_MS));
        assert_eq!(parse_millis("7d"), Some(7 * DAY_MS));
        assert_eq!(parse_millis("0s"), Some(0));
        for bad in [
            "",
            "s",
            "5",
            "5 s",
            "1.5h",
            "-1s",
            "5sec",
            "h5",
            "99999999999999999999d",
        ] {
            assert_eq!(parse_millis(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn suggestions() {
        assert_eq!(did_you_mean("tll", OPTIONS), " (did you mean `ttl`?)");
        assert_eq!(
            did_you_mean("on_duplicates", OPTIONS),
            " (did you mean `on_duplicate`?)"
        );
        assert_eq!(did_you_mean("colour", OPTIONS), "");
    }
}
