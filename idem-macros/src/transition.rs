//! `#[transition(machine = ORDER, key = "{order_id}", to = "shipped")]`: the body runs as
//! a state-machine move, only for the caller that performs it.
//!
//! The key template is the one of `#[idempotent]` (`key::Template`), checked against the
//! signature by the same function (`expand::check_references`). The rewrite is one call
//! into `__private` with the body as an `async move` block yielding `Result<T, E>`, while
//! the function returns `Result<Step<T>, E>`.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::spanned::Spanned;
use syn::{GenericArgument, Ident, ItemFn, LitStr, PathArguments, ReturnType, Token, Type};

use crate::attr::{
    Config, CrateArg, Errors, parse_eq_str, parse_options, set_once, unknown_option,
};
use crate::expand::{Params, check_references};
use crate::key::Template;
use crate::retry::PRIVATE_ALIAS;

mod kw {
    syn::custom_keyword!(machine);
    syn::custom_keyword!(key);
    syn::custom_keyword!(to);
}

const OPTIONS: &[&str] = &["machine", "key", "to", "crate"];

const EXAMPLE: &str = "#[transition(machine = ORDER, key = \"{order_id}\", to = \"shipped\")]";

/// `machine = ORDER`
struct MachineArg {
    kw: Span,
    path: syn::Path,
}

/// `key = "{order_id}"`
struct KeyArg {
    kw: Span,
    template: Template,
}

/// `to = "shipped"`
struct ToArg {
    kw: Span,
    lit: LitStr,
}

enum Arg {
    Machine(MachineArg),
    Key(KeyArg),
    To(ToArg),
    Crate(CrateArg),
}

impl Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.peek(kw::machine) {
            let kw: kw::machine = input.parse()?;
            MachineArg::parse_value(kw.span, input).map(Arg::Machine)
        } else if input.peek(kw::key) {
            let kw: kw::key = input.parse()?;
            let lit = parse_eq_str(input, "key", "\"{order_id}\"")?;
            Ok(Arg::Key(KeyArg {
                kw: kw.span,
                template: Template::parse(lit)?,
            }))
        } else if input.peek(kw::to) {
            let kw: kw::to = input.parse()?;
            ToArg::parse_value(kw.span, input).map(Arg::To)
        } else if input.peek(Token![crate]) {
            let kw: Token![crate] = input.parse()?;
            CrateArg::parse_value(kw.span, input).map(Arg::Crate)
        } else {
            let name = input.call(Ident::parse_any)?;
            Err(match name.to_string().as_str() {
                option @ ("lease" | "wait" | "ttl") => syn::Error::new(
                    name.span(),
                    format!(
                        "`{option}` belongs to the state machine, not to one move: set it where \
                         the machine is built, with StateMachine::builder(..).{option}(..)"
                    ),
                ),
                _ => unknown_option(&name, OPTIONS),
            })
        }
    }
}

impl MachineArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        input.parse::<Token![=]>()?;
        if input.peek(LitStr) {
            let lit: LitStr = input.parse()?;
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`machine` takes the path of a static StateMachine, not a string; write it \
                     without quotes, e.g. machine = {}",
                    lit.value()
                ),
            ));
        }
        let path: syn::Path = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "`machine` takes the path of a static StateMachine (or a static that \
                 derefs to one, like a LazyLock<StateMachine>), e.g. machine = ORDER",
            )
        })?;
        Ok(MachineArg { kw, path })
    }
}

impl ToArg {
    fn parse_value(kw: Span, input: ParseStream<'_>) -> syn::Result<Self> {
        let lit = parse_eq_str(input, "to", "\"shipped\"")?;
        if lit.value().is_empty() {
            return Err(syn::Error::new(
                lit.span(),
                "`to` is empty; name the state this move enters, e.g. to = \"shipped\"",
            ));
        }
        Ok(ToArg { kw, lit })
    }
}

/// The options as given, each at most once.
#[derive(Default)]
struct Configuration {
    machine: Option<MachineArg>,
    key: Option<KeyArg>,
    to: Option<ToArg>,
    krate: Option<CrateArg>,
}

/// The checked options.
struct Checked {
    machine: syn::Path,
    key: Template,
    to: LitStr,
    krate: Option<CrateArg>,
}

impl Configuration {
    fn set(&mut self, arg: Arg) -> syn::Result<()> {
        match arg {
            Arg::Machine(a) => {
                let kw = a.kw;
                set_once(&mut self.machine, a, "machine", kw)
            }
            Arg::Key(a) => {
                let kw = a.kw;
                set_once(&mut self.key, a, "key", kw)
            }
            Arg::To(a) => {
                let kw = a.kw;
                set_once(&mut self.to, a, "to", kw)
            }
            Arg::Crate(a) => {
                let kw = a.kw();
                set_once(&mut self.krate, a, "crate", kw)
            }
        }
    }

    /// Parses the options; `None` if a required one is missing or did not parse (each
    /// mistake is in `errors`).
    fn parse(args: TokenStream, errors: &mut Errors) -> Option<Checked> {
        let mut config = Configuration::default();
        let failed = parse_options(args, errors, Arg::parse, |arg| config.set(arg));
        let mut missing = |name: &str, what: &str| {
            // An option that was written but did not parse has its own error already.
            if !failed.iter().any(|f| f == name) {
                errors.push(syn::Error::new(
                    Span::call_site(),
                    format!("missing `{name}`: {what}, e.g. {EXAMPLE}"),
                ));
            }
        };
        if config.machine.is_none() {
            missing(
                "machine",
                "name the static StateMachine this move belongs to",
            );
        }
        if config.key.is_none() {
            missing(
                "key",
                "name which record moves (an order id, an approval id)",
            );
        }
        if config.to.is_none() {
            missing("to", "name the state this move enters");
        }
        Some(Checked {
            machine: config.machine?.path,
            key: config.key?.template,
            to: config.to?.lit,
            krate: config.krate,
        })
    }
}

/// Expands `#[transition(args)] item`. On an error the function is still emitted next to
/// it, so an editor keeps seeing it (see `unexpanded`).
pub(crate) fn transition(args: TokenStream, item: TokenStream) -> TokenStream {
    crate::expand::on_fn(
        item,
        "#[transition] goes on an `async fn` with a body returning `Result<Step<T>, E>`",
        |func| expand(args, func),
        unexpanded,
    )
}

/// The function as written, for when the attribute has an error. Its body yields
/// `Result<T, E>` where the signature says `Result<Step<T>, E>`, so emitting it unchanged
/// would add a type error to the real one; the body is kept (type-checked, for the
/// editor) in a block that is never run, and the function diverges.
fn unexpanded(func: &ItemFn) -> TokenStream {
    let Ok(types) = step_types(&func.sig.output, &func.sig.ident) else {
        // The return type is the mistake: as written, it agrees with the body.
        return func.to_token_stream();
    };
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let body_ty = &types.body;
    let ret = Ident::new("__idem_ret", Span::mixed_site());
    let typed_body = crate::expand::typed_block(&ret, body_ty, block);
    quote! {
        #(#attrs)*
        #vis #sig {
            let _ = async move #typed_body;
            ::core::unreachable!("#[transition] did not expand: see its compile error")
        }
    }
}

fn expand(args: TokenStream, func: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let checked = Configuration::parse(args, &mut errors);
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[transition] needs an `async fn`: the body runs as a future while the move is \
             held; write `async fn`",
        ));
    }
    let types = step_types(&sig.output, &sig.ident)
        .map_err(|e| errors.push(e))
        .ok();
    // The key's placeholders are checked exactly as `#[idempotent]` checks its key.
    let checked = checked.map(|checked| {
        let as_key = Config::key_only(checked.key);
        check_references(&as_key, &Params::of(func), &sig.ident, &mut errors);
        Checked {
            key: as_key.key,
            ..checked
        }
    });
    errors.finish()?;
    match (checked, types) {
        (Some(checked), Some(types)) => Ok(rewrite(func, checked, types)),
        _ => Err(syn::Error::new(
            Span::call_site(),
            "idem: internal error in #[transition], please report it",
        )),
    }
}

/// The declared `Result<Step<T>, E>`, the `Result<T, E>` the body yields, and the span of
/// the return type's first token.
struct StepTypes<'a> {
    whole: &'a Type,
    body: Type,
}

fn step_types<'a>(output: &'a ReturnType, name: &Ident) -> syn::Result<StepTypes<'a>> {
    const HOW: &str = "#[transition] needs the return type written as `Result<Step<T>, E>` \
                       (or `Result<Step, E>` for T = ()): the caller that performs the move \
                       gets `Step::Performed { from, value }` with the body's `Ok(value)`, the \
                       others `Step::AlreadyThere`; `E: From<idem_runtime::Error>` carries \
                       idem's own errors, such as an invalid transition";
    let whole = match output {
        ReturnType::Type(_, ty) => &**ty,
        ReturnType::Default => {
            return Err(syn::Error::new(
                name.span(),
                format!("`{name}` returns nothing; {HOW}"),
            ));
        }
    };
    let wrong = || syn::Error::new_spanned(whole, HOW);
    let Type::Path(path) = whole else {
        return Err(wrong());
    };
    let Some(last) = path.path.segments.last() else {
        return Err(wrong());
    };
    if !last.ident.to_string().ends_with("Result") {
        return Err(wrong());
    }
    let alias = || {
        syn::Error::new_spanned(
            whole,
            format!(
                "{HOW} (a `Result` alias with one parameter hides the error type; write both \
                 out)"
            ),
        )
    };
    let PathArguments::AngleBracketed(generics) = &last.arguments else {
        return Err(alias());
    };
    let types: Vec<&Type> = generics
        .args
        .iter()
        .filter_map(|arg| match arg {
            GenericArgument::Type(ty) => Some(ty),
            _ => None,
        })
        .collect();
    let [ok, _err] = types.as_slice() else {
        return Err(alias());
    };
    let value = step_value(ok)?;
    // The body's type: the same `Result` path with `Step<T>` replaced by `T`.
    let mut body = whole.clone();
    if let Type::Path(path) = &mut body
        && let Some(last) = path.path.segments.last_mut()
        && let PathArguments::AngleBracketed(generics) = &mut last.arguments
        && let Some(first) = generics
            .args
            .iter_mut()
            .find(|arg| matches!(arg, GenericArgument::Type(_)))
    {
        *first = GenericArgument::Type(value);
    }
    Ok(StepTypes { whole, body })
}

/// The `Result<T, E>` that the body of a function returning `Result<Step<T>, E>` yields,
/// for `#[retry_on_conflict]` written above `#[transition]`.
pub(crate) fn body_type(output: &ReturnType, name: &Ident) -> syn::Result<Type> {
    step_types(output, name).map(|types| types.body)
}

/// `T` of `Step<T>` (`()` for a bare `Step`), or an error at the `Ok` type.
fn step_value(ok: &Type) -> syn::Result<Type> {
    let wrong = || {
        syn::Error::new_spanned(
            ok,
            format!(
                "#[transition] functions return `Result<Step<T>, E>`, not `Result<{}, E>`: \
                 the caller that performs the move gets `Step::Performed {{ from, value }}` \
                 with the body's `Ok(value)`, the others `Step::AlreadyThere`; write \
                 `Result<Step<{}>, E>` and keep returning `Ok(value)` from the body",
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
    if last.ident != "Step" {
        return Err(wrong());
    }
    match &last.arguments {
        PathArguments::None => Ok(syn::parse_quote_spanned!(last.ident.span()=> ())),
        // `Step<A, B>` is reported by rustc itself; the expansion goes on with `A`.
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
    } = func;
    let (private_path, private_span) = CrateArg::private(checked.krate);
    let private = Ident::new(PRIVATE_ALIAS, Span::call_site());
    let import = quote_spanned!(private_span=> use #private_path as #private;);

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
    let typed_body = crate::expand::typed_block(&ret, body_ty, block);
    let body = quote!(async move #typed_body);

    // As in `#[idempotent]`: every token of the call carries the span of the first token
    // of the return type, so an `E` without `From<idem_runtime::Error>` is reported once,
    // on the signature.
    let at = crate::expand::signature_span(&types.whole);
    let private_at = Ident::new(PRIVATE_ALIAS, at);
    let function_at = Ident::new("transition", at);
    let mut args = Group::new(
        Delimiter::Parenthesis,
        quote!(#rt, #machine, #key, #to, #body),
    );
    args.set_span(at);
    let call = quote_spanned!(at=> #private_at::#function_at::<_, _, _> #args .await);

    quote! {
        #(#attrs)*
        #vis #sig {
            #import
            let #machine: &#private::StateMachine = #machine_ref;
            let #rt = #private::current();
            let #key = #rt.state_key(#machine, #rendered_key);
            #call
        }
    }
}
