//! The key template: `"charge:{order.id}"` parsed into literal text and placeholders.
//!
//! Parsing happens once, when the attribute is read; checking the placeholders' roots
//! against the function's parameters happens in `signature::check_references`, which
//! knows the signature. `#[idempotent]` and `#[transition]` share this template.
//! Every error is spanned at the key literal: a string literal cannot be sub-spanned on
//! stable Rust, so the message quotes the offending placeholder instead.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::ParseStream;
use syn::{Ident, Index, LitStr, Token};

use crate::options::{Decl, Value, string};

/// One parsed key template.
pub(crate) struct Template {
    pub(crate) lit: LitStr,
    pieces: Vec<Piece>,
}

enum Piece {
    Text(String),
    Field(Placeholder),
}

/// `{root.field.0}`: a parameter (or `self`) and the fields reached from it.
pub(crate) struct Placeholder {
    /// The placeholder as written, for messages.
    pub(crate) source: String,
    pub(crate) root: Root,
    fields: Vec<Field>,
}

pub(crate) enum Root {
    SelfValue(Token![self]),
    Param(Ident),
}

impl Root {
    pub(crate) fn name(&self) -> String {
        match self {
            Root::SelfValue(_) => "self".to_owned(),
            Root::Param(ident) => ident.to_string(),
        }
    }
}

enum Field {
    Named(Ident),
    Unnamed(Index),
}

/// `key = "charge:{order.id}"`
impl Value for Template {
    fn parse(input: ParseStream<'_>, option: &Decl) -> syn::Result<Self> {
        Template::new(string(input, option)?)
    }
}

impl Template {
    pub(crate) fn new(lit: LitStr) -> syn::Result<Self> {
        let value = lit.value();
        if value.is_empty() {
            return Err(syn::Error::new(
                lit.span(),
                "the key is empty; name what identifies one operation, \
                 e.g. key = \"charge:{order.id}\"",
            ));
        }
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = value.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '}' => {
                    return Err(syn::Error::new(
                        lit.span(),
                        "unmatched `}` in the key; write `}}` for a literal brace",
                    ));
                }
                '{' => {
                    let mut inner = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        inner.push(c);
                    }
                    if !closed {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unclosed `{{{inner}` in the key; close the placeholder with `}}` \
                                 or write `{{{{` for a literal brace"
                            ),
                        ));
                    }
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Field(Placeholder::parse(&inner, &lit)?));
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template { lit, pieces })
    }

    /// True if the template is one placeholder and nothing else: `"{token}"`.
    pub(crate) fn is_single_placeholder(&self) -> bool {
        matches!(self.pieces.as_slice(), [Piece::Field(_)])
    }

    pub(crate) fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Field(p) => Some(p),
            Piece::Text(_) => None,
        })
    }

    /// `::core::format_args!("charge:{}", order.id)`: every placeholder is rendered
    /// through `Display`, literal braces are escaped again for `format_args!`.
    pub(crate) fn render(&self) -> TokenStream {
        let mut fmt = String::new();
        let mut args = Vec::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => {
                    fmt.push_str(&text.replace('{', "{{").replace('}', "}}"));
                }
                Piece::Field(p) => {
                    fmt.push_str("{}");
                    args.push(p.expr());
                }
            }
        }
        let fmt = LitStr::new(&fmt, self.lit.span());
        quote!(::core::format_args!(#fmt #(, #args)*))
    }

    /// Statements writing the key into `w` part by part: literal text as bytes, each
    /// placeholder through `#private::Part`, which writes integers and strings directly
    /// and anything else through `Display` (the same bytes `render` gives, without the
    /// formatting machinery). A part that is not `Display` is reported at the key.
    pub(crate) fn render_parts(&self, w: &Ident, private: &Ident) -> TokenStream {
        let span = self.lit.span();
        let mut out = TokenStream::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => {
                    let text = LitStr::new(text, span);
                    out.extend(quote!(#w.text(#text);));
                }
                Piece::Field(p) => {
                    let expr = p.expr();
                    let put = quote_spanned!(span=> .put(#w, __idem_part));
                    out.extend(quote! {{
                        let __idem_part = &(#expr);
                        (&&#private::Part(__idem_part)).kind() #put;
                    }});
                }
            }
        }
        quote! {{
            #[allow(unused_imports)]
            use #private::{ViaDisplay as _, ViaFast as _};
            #out
        }}
    }
}

impl Placeholder {
    fn parse(inner: &str, lit: &LitStr) -> syn::Result<Self> {
        let source = format!("{{{inner}}}");
        let trimmed = inner.trim();
        let invalid = |why: &str| {
            syn::Error::new(
                lit.span(),
                format!(
                    "invalid placeholder `{source}` in the key: {why}; write an argument name, \
                     optionally followed by fields, e.g. `{{order.id}}`"
                ),
            )
        };
        if trimmed.is_empty() {
            return Err(invalid(
                "it names no argument (positional `{}` is not supported)",
            ));
        }
        if trimmed.contains(':') {
            return Err(invalid(
                "format specs are not supported, every part is rendered with `Display`",
            ));
        }
        let mut segments = trimmed.split('.').map(str::trim);
        let first = segments.next().unwrap_or_default();
        let root = if first == "self" {
            Root::SelfValue(Token![self](lit.span()))
        } else {
            match syn::parse_str::<Ident>(first) {
                Ok(mut ident) => {
                    // The literal's span carries the caller's hygiene, so the identifier
                    // resolves to the function's parameter of that name.
                    ident.set_span(lit.span());
                    Root::Param(ident)
                }
                Err(_) => return Err(invalid(&format!("`{first}` is not an identifier"))),
            }
        };
        let mut fields = Vec::new();
        for segment in segments {
            if let Ok(index) = segment.parse::<u32>() {
                fields.push(Field::Unnamed(Index {
                    index,
                    span: lit.span(),
                }));
            } else if let Ok(mut ident) = syn::parse_str::<Ident>(segment) {
                ident.set_span(lit.span());
                fields.push(Field::Named(ident));
            } else {
                return Err(invalid(&format!("`{segment}` is not a field name")));
            }
        }
        Ok(Placeholder {
            source,
            root,
            fields,
        })
    }

    fn expr(&self) -> TokenStream {
        let mut expr = match &self.root {
            Root::SelfValue(token) => token.to_token_stream(),
            Root::Param(ident) => ident.to_token_stream(),
        };
        for field in &self.fields {
            match field {
                Field::Named(ident) => expr.extend(quote!(.#ident)),
                Field::Unnamed(index) => expr.extend(quote!(.#index)),
            }
        }
        expr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(text: &str) -> LitStr {
        LitStr::new(text, proc_macro2::Span::call_site())
    }

    fn render(text: &str) -> String {
        match Template::new(lit(text)) {
            Ok(template) => template.render().to_string(),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn renders_text_and_placeholders() {
        assert_eq!(
            render("charge:{order.id}"),
            r#":: core :: format_args ! ("charge:{}" , order . id)"#
        );
        assert_eq!(
            render("{self.name}/{pair.0}/{sku}"),
            r#":: core :: format_args ! ("{}/{}/{}" , self . name , pair . 0 , sku)"#
        );
        assert_eq!(render("nightly"), r#":: core :: format_args ! ("nightly")"#);
    }

    #[test]
    fn escaped_braces_stay_literal() {
        // `{{x}}` is the text `{x}`, escaped again for `format_args!`.
        assert_eq!(
            render("{{x}}:{id}"),
            r#":: core :: format_args ! ("{{x}}:{}" , id)"#
        );
    }

    #[test]
    fn malformed_templates_are_errors() {
        for (template, expected) in [
            ("", "the key is empty"),
            ("a:{id", "unclosed `{id`"),
            ("a}b", "unmatched `}`"),
            ("a:{}", "names no argument"),
            ("a:{id:?}", "format specs are not supported"),
            ("a:{order-id}", "`order-id` is not an identifier"),
            ("a:{order.}", "`` is not a field name"),
            ("a:{order.type}", "`type` is not a field name"),
            ("a:{1}", "`1` is not an identifier"),
        ] {
            let rendered = render(template);
            assert!(
                rendered.starts_with("error: ") && rendered.contains(expected),
                "{template:?} gave {rendered:?}, expected {expected:?}"
            );
        }
    }

    #[test]
    fn single_placeholder() {
        let single = |text: &str| Template::new(lit(text)).is_ok_and(|t| t.is_single_placeholder());
        assert!(single("{token}"));
        assert!(single("{req.token}"));
        assert!(!single("tok:{token}"));
        assert!(!single("{a}{b}"));
        assert!(!single("token"));
    }
}
