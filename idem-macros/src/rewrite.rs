//! What every rewrite shares: the frame that parses the item and keeps it on an error,
//! the import of the runtime's private module, the typed body, and the span that unmet
//! bounds are reported at.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::{Block, Ident, ItemFn, Stmt, UseTree};

use crate::options::{Arg, CratePath};

/// The name every expansion imports the runtime's private module under. A body that
/// starts with this import was already rewritten by an idem attribute.
const PRIVATE_ALIAS: &str = "__idem_private";

/// The frame of each attribute of this crate: parses `item` as a function and expands
/// it. Anything else is an error saying where the attribute goes (`misplaced`). On an
/// expansion error, `keep(func)` (the function as an editor should go on seeing it) is
/// emitted next to the error, so one mistake does not cascade into "cannot find
/// function" errors at every call site.
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

/// The runtime's private module: `::idem_runtime::__private`, or under the path of the
/// `crate` option. Everything an expansion names from the runtime goes through it.
pub(crate) struct Private {
    path: TokenStream,
    /// Where a wrong `crate` path is reported: its literal.
    span: Span,
}

impl Private {
    pub(crate) fn new(krate: Option<Arg<CratePath>>) -> Self {
        match krate {
            Some(arg) => {
                let CratePath { path, lit } = arg.value;
                Private {
                    path: quote_spanned!(lit=> #path::__private),
                    span: lit,
                }
            }
            None => Private {
                path: quote!(::idem_runtime::__private),
                span: Span::call_site(),
            },
        }
    }

    /// `use ::idem_runtime::__private as __idem_private;`, the first statement of every
    /// rewritten body.
    pub(crate) fn import(&self) -> TokenStream {
        let Private { path, span } = self;
        let alias = Self::alias();
        quote_spanned!(*span=> use #path as #alias;)
    }

    /// The alias the import binds.
    pub(crate) fn alias() -> Ident {
        Self::alias_at(Span::call_site())
    }

    /// The alias, spanned at `span` (see [`signature_span`]).
    pub(crate) fn alias_at(span: Span) -> Ident {
        Ident::new(PRIVATE_ALIAS, span)
    }
}

/// True if `block` is the rewrite of an idem attribute: it imports the runtime's private
/// module under [`Private::alias`]. Attribute macros expand from the top down, so an
/// attribute written below another one sees the body already rewritten by it.
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
