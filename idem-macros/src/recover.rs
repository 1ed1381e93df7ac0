//! `recover` and `context = [...]` of `#[idempotent]`: the checks that a function can be
//! recovered, the recording of its arguments, and its recovery entry, submitted at link
//! time so that marking a function is its whole registration.
//!
//! Every parameter is either *recorded* (encoded with the claim, decoded by the entry: a
//! `&T` as `T`, a `&str` as `String`, a `&[T]` as `Vec<T>`) or *context* (named in
//! `context = [...]`, given by the recoverer by type: a `&T` as a reference to what was
//! provided, a `T` as a clone of it).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, Type, TypeReference};

use crate::diagnostics::Errors;
use crate::rewrite::Private;

/// One parameter of a recoverable function.
struct Param<'a> {
    name: &'a Ident,
    ty: &'a Type,
    context: bool,
}

/// A recoverable function's parameters, checked: plain names, no receiver, no generics.
pub(crate) struct Recover<'a> {
    params: Vec<Param<'a>>,
}

impl<'a> Recover<'a> {
    pub(crate) fn check(func: &'a ItemFn, context: &[Ident], all: &mut Errors) -> Option<Self> {
        let sig = &func.sig;
        let mut errors = Errors::default();
        if let Some(param) = sig.generics.params.first() {
            errors.push(syn::Error::new(
                param.span(),
                "`recover` needs a function without type or lifetime parameters: the \
                 recoverer calls it from the recorded arguments, with concrete types; \
                 write the types out, or call a generic function from a concrete one",
            ));
        }
        let mut params = Vec::new();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(r) => errors.push(syn::Error::new(
                    r.span(),
                    "`recover` applies to free functions: the recoverer has no `self` to \
                     call a method on; move the body into a free function that takes the \
                     method's services as parameters named in `context = [...]`",
                )),
                FnArg::Typed(t) => match &*t.pat {
                    Pat::Ident(p) if p.subpat.is_none() => {
                        if let Type::ImplTrait(_) = &*t.ty {
                            errors.push(syn::Error::new(
                                t.ty.span(),
                                "`recover` needs a nameable type here: the recoverer \
                                 decodes or provides each argument by its type",
                            ));
                        }
                        params.push(Param {
                            name: &p.ident,
                            ty: &t.ty,
                            context: context.contains(&p.ident),
                        });
                    }
                    other => errors.push(syn::Error::new(
                        other.span(),
                        "`recover` needs each argument bound to a plain name (e.g. \
                         `order: Order`): the recoverer records and passes them by name",
                    )),
                },
            }
        }
        match errors.finish() {
            Ok(()) => Some(Recover { params }),
            Err(e) => {
                all.push(e);
                None
            }
        }
    }

    /// The bound checks: each recorded argument can be recorded (at its type), the error
    /// can be reported (at `at`, the return type).
    pub(crate) fn bounds(&self, returns: &TokenStream, at: Span) -> TokenStream {
        let mut out = TokenStream::new();
        for p in self.params.iter().filter(|p| !p.context) {
            let (owned, span) = (owned(p.ty), owned_span(p.ty));
            let private_at = Private::alias_at(span);
            out.extend(quote_spanned!(span=>
                #private_at::recorded(::core::marker::PhantomData::<#owned>);
            ));
        }
        let private_at = Private::alias_at(at);
        out.extend(quote_spanned!(at=> #private_at::reported(#returns);));
        out
    }

    /// The recorded arguments, encoded under `key`: a `Result<Bytes, Error>`. Each is
    /// pushed at its parameter's span, as its bound is asserted there, so an argument
    /// that cannot be recorded is one error, at the argument.
    pub(crate) fn args(&self, key: &Ident) -> TokenStream {
        let private = Private::alias();
        let writer = Ident::new("__idem_args_w", Span::mixed_site());
        let pushes = self.params.iter().filter(|p| !p.context).map(|p| {
            let (name, owned, span) = (p.name, owned(p.ty), owned_span(p.ty));
            // `&*x` for a reference: the value it points at, of the recorded type.
            let value = match p.ty {
                Type::Reference(_) => quote_spanned!(span=> &*#name),
                _ => quote_spanned!(span=> &#name),
            };
            quote_spanned!(span=> #writer.push::<#owned, _, _>(#value);)
        });
        quote! {{
            let mut #writer = #private::ArgsWriter::new();
            #(#pushes)*
            #writer.finish(&#key)
        }}
    }

    /// The recovery entry of function `name` with options `options`, submitted for the
    /// recoverer to find.
    pub(crate) fn entry(&self, name: &Ident, options: &Ident) -> TokenStream {
        let private = Private::alias();
        let args = Ident::new("__idem_args", Span::mixed_site());
        let ctx = Ident::new("__idem_ctx", Span::mixed_site());
        let error = Ident::new("__idem_error", Span::mixed_site());
        let reader = Ident::new("__idem_args_r", Span::mixed_site());
        let reads = self.params.iter().filter(|p| !p.context).map(|p| {
            let (name, owned, span) = (p.name, owned(p.ty), owned_span(p.ty));
            let next = quote_spanned!(span=> #reader.read::<#owned, _>());
            quote! {
                #[allow(unused_mut)]
                let mut #name: #owned = match #next {
                    ::core::result::Result::Ok(v) => v,
                    ::core::result::Result::Err(#error) => {
                        return #private::Ran::Undecodable(#error);
                    }
                };
            }
        });
        let mut needs = Vec::new();
        let mut provided = Vec::new();
        for p in self.params.iter().filter(|p| p.context) {
            let inner = owned(p.ty);
            let label = quote!(#inner).to_string();
            needs
                .push(quote!((#private::TypeId::of::<#inner> as fn() -> #private::TypeId, #label)));
            let name = p.name;
            let value = match p.ty {
                Type::Reference(_) => quote!(#ctx.get::<#inner>()),
                _ => quote!(#ctx.get::<#inner>().cloned()),
            };
            // `prepare` checked every need against the context before this runs.
            provided.push(quote! {
                let ::core::option::Option::Some(#name) = #value else {
                    return #private::Ran::Failed(::std::format!("no {} in the recoverer's context", #label));
                };
            });
        }
        let call_args = self.params.iter().map(|p| {
            let name = p.name;
            match (p.context, p.ty) {
                (
                    false,
                    Type::Reference(TypeReference {
                        mutability: Some(_),
                        ..
                    }),
                ) => {
                    quote!(&mut #name)
                }
                (false, Type::Reference(_)) => quote!(&#name),
                _ => quote!(#name),
            }
        });
        quote! {
            #private::submit! {
                #private::Recoverable::new(
                    &#options,
                    &[#(#needs),*],
                    |#args: #private::Bytes, #ctx: #private::Arc<#private::Context>|
                        -> #private::BoxFuture<'static, #private::Ran> {
                        ::std::boxed::Box::pin(async move {
                            let mut #reader = #private::ArgsReader::new(&#args);
                            #(#reads)*
                            if let ::core::result::Result::Err(#error) = #reader.finish() {
                                return #private::Ran::Undecodable(#error);
                            }
                            #(#provided)*
                            #private::ran(#name(#(#call_args),*).await)
                        })
                    },
                )
            }
        }
    }
}

/// What an argument of type `ty` is recorded (or provided) as: `&T` as `T`, `&str` as
/// `String`, `&[T]` as `Vec<T>`.
fn owned(ty: &Type) -> TokenStream {
    match ty {
        Type::Reference(r) => match &*r.elem {
            Type::Path(p) if p.qself.is_none() && p.path.is_ident("str") => {
                quote!(::std::string::String)
            }
            Type::Slice(s) => {
                let elem = &s.elem;
                quote!(::std::vec::Vec<#elem>)
            }
            elem => quote!(#elem),
        },
        other => quote!(#other),
    }
}

/// The rules between `recover` and the other options: dedup only, no `transaction`, and
/// `context` only with `recover`. Each is reported at the option's name.
pub(crate) fn check_options(
    recover: Option<Span>,
    dedup: bool,
    lock: bool,
    transaction: Option<Span>,
    context: Option<Span>,
    errors: &mut Errors,
) {
    let Some(at) = recover else {
        if let Some(context) = context {
            errors.push(syn::Error::new(
                context,
                "`context` names the arguments a recoverer provides, so it needs `recover`; \
                 add `recover`, or remove `context`",
            ));
        }
        return;
    };
    if lock {
        errors.push(syn::Error::new(
            at,
            "`recover` does not apply to strategy = \"lock\": a lock keeps no record of the \
             call to resume; use strategy = \"dedup\" (the default)",
        ));
    } else if !dedup {
        errors.push(syn::Error::new(
            at,
            "`recover` applies to strategy = \"dedup\" only: a token's call belongs to the \
             client holding the token, which retries it",
        ));
    }
    if let Some(tx) = transaction {
        errors.push(syn::Error::new(
            tx,
            "`transaction` does not apply with `recover`: a recoverer has no transaction of \
             the caller's to run in; write the transactional work as a `step_tx` inside the \
             body instead",
        ));
    }
}

/// Where an argument's recorded type is written (`T` in `&T`): every bound on it is
/// checked there, so rustc reports an unmet one once.
fn owned_span(ty: &Type) -> Span {
    match ty {
        Type::Reference(r) => r.elem.span(),
        other => other.span(),
    }
}
