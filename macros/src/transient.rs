//! `#[derive(Transient)]`, in three steps like the attributes: [`parse`] reads each variant's
//! mark, [`check`] holds the marks against the variants, [`generate`] writes the impl.

use crate::args::Errors;
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, Member};

enum Mark {
    Permanent,
    Retry,
    After(Member),
    From,
}

// Input:
//     #[derive(Transient)]
//     enum E { #[transient] Timeout, #[transient(after = wait)] Limited { wait: Duration }, #[transient(from)] Io(io::Error), Declined }
//
// Output:
//     impl ::jobguard::Transient for E {
//         fn verdict(&self) -> ::jobguard::Verdict {
//             match self {
//                 E::Timeout { .. } => ::jobguard::Verdict::Retry,
//                 E::Limited { wait: __jobguard_after, .. } => ::jobguard::__private::after(__jobguard_after),
//                 E::Io { 0: __jobguard_inner, .. } => ::jobguard::Transient::verdict(__jobguard_inner),
//                 E::Declined { .. } => ::jobguard::Verdict::Fail,
//             }
//         }
//     }
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let mut errors = Errors::default();
    let variants = parse(&input, &mut errors);
    if let Some(variants) = &variants {
        check(variants, &mut errors);
    }
    match variants {
        Some(variants) if errors.is_empty() => generate(&input, &variants),
        _ => fallback(&input, errors),
    }
}

/// One variant as the derive sees it: its name, its fields and its mark.
struct Variant<'a> {
    ident: &'a Ident,
    fields: &'a Fields,
    mark: Mark,
}

/// Reads each variant's `#[transient(...)]`. `None` when the input is not an enum.
fn parse<'a>(input: &'a DeriveInput, errors: &mut Errors) -> Option<Vec<Variant<'a>>> {
    let Data::Enum(data) = &input.data else {
        errors.at(
            input.ident.span(),
            "`#[derive(Transient)]` goes on an enum whose variants are marked `#[transient]`; for a struct, implement `jobguard::Transient` by hand",
        );
        return None;
    };
    let variants = data
        .variants
        .iter()
        .map(|variant| Variant {
            ident: &variant.ident,
            fields: &variant.fields,
            mark: mark(&variant.attrs, errors),
        })
        .collect();
    Some(variants)
}

/// A variant's mark: unmarked is permanent.
fn mark(attrs: &[syn::Attribute], errors: &mut Errors) -> Mark {
    let mut mark = Mark::Permanent;
    for attr in attrs.iter().filter(|a| a.path().is_ident("transient")) {
        if !matches!(mark, Mark::Permanent) {
            errors.at(
                attr.span(),
                "`#[transient]` given twice on this variant; keep one",
            );
            continue;
        }
        mark = match &attr.meta {
            syn::Meta::Path(_) => Mark::Retry,
            _ => {
                let mut got = None;
                let parsed = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("from") {
                        got = Some(Mark::From);
                        Ok(())
                    } else if meta.path.is_ident("after") {
                        let member: Member = meta.value()?.parse()?;
                        got = Some(Mark::After(member));
                        Ok(())
                    } else {
                        let name = quote::ToTokens::to_token_stream(&meta.path)
                            .to_string()
                            .replace(' ', "");
                        let near = crate::args::nearest(&name, &["after", "from"])
                            .map(|n| format!("; did you mean `{n}`?"))
                            .unwrap_or_default();
                        Err(meta.error(format!(
                            "unknown argument `{name}` in `#[transient(...)]`{near}\n\
                             write `#[transient]` (retry on the curve), `#[transient(after = field)]` \
                             (retry after the field's `Duration`) or `#[transient(from)]` (ask the one field)"
                        )))
                    }
                });
                if let Err(e) = parsed {
                    errors.push(e);
                }
                got.unwrap_or(Mark::Retry)
            }
        };
    }
    mark
}

/// Each mark against its variant: `after = field` names a field the variant has, and `from`
/// is on a variant of exactly one field.
fn check(variants: &[Variant<'_>], errors: &mut Errors) {
    for variant in variants {
        let v = variant.ident;
        match &variant.mark {
            Mark::After(member) if !has_member(variant.fields, member) => {
                let fields: Vec<String> = variant
                    .fields
                    .iter()
                    .enumerate()
                    .map(|(i, f)| {
                        f.ident
                            .as_ref()
                            .map_or_else(|| i.to_string(), ToString::to_string)
                    })
                    .collect();
                let listed = if fields.is_empty() {
                    format!(
                        "`{v}` has no fields; `#[transient(after = field)]` needs a `Duration` or `Option<Duration>` field"
                    )
                } else {
                    let names = fields.iter().map(String::as_str).collect::<Vec<_>>();
                    let near = crate::args::nearest(&show(member), &names)
                        .map(|n| format!("did you mean `after = {n}`? "))
                        .unwrap_or_default();
                    format!(
                        "{near}its fields: {}",
                        fields
                            .iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                errors.at(
                    member.span(),
                    format!(
                        "`after = {}`: variant `{v}` has no field `{}`\n{listed}",
                        show(member),
                        show(member)
                    ),
                );
            }
            Mark::From if variant.fields.len() != 1 => {
                let count = match variant.fields.len() {
                    0 => "no fields".to_owned(),
                    n => format!("{n} fields"),
                };
                errors.at(
                    v.span(),
                    format!(
                        "`#[transient(from)]` asks the variant's one field for its verdict, but `{v}` has {count}; \
                         keep one field (the inner error), or mark the variant `#[transient]` to retry it on the curve"
                    ),
                );
            }
            Mark::Permanent | Mark::Retry | Mark::After(_) | Mark::From => {}
        }
    }
}

/// The impl, from checked variants.
fn generate(input: &DeriveInput, variants: &[Variant<'_>]) -> TokenStream {
    let krate = quote!(::jobguard);
    let name = &input.ident;
    let arms = variants.iter().map(|variant| {
        let v = variant.ident;
        match &variant.mark {
            Mark::Permanent => quote!(#name::#v { .. } => #krate::Verdict::Fail),
            Mark::Retry => quote!(#name::#v { .. } => #krate::Verdict::Retry),
            Mark::After(member) => {
                quote_spanned!(member.span()=> #name::#v { #member: __jobguard_after, .. } => #krate::__private::after(__jobguard_after))
            }
            Mark::From => {
                let field = variant.fields.iter().next();
                let member = match field.and_then(|f| f.ident.as_ref()) {
                    Some(id) => Member::Named(id.clone()),
                    None => Member::Unnamed(0.into()),
                };
                let span = field.map_or_else(|| v.span(), |f| f.ty.span());
                let inner = format_ident!("__jobguard_inner");
                quote_spanned!(span=> #name::#v { #member: #inner, .. } => #krate::Transient::verdict(#inner))
            }
        }
    });
    let arms: Vec<TokenStream> = arms.collect();
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let body = if arms.is_empty() {
        quote!(match *self {})
    } else {
        quote!(match self { #(#arms,)* })
    };
    quote! {
        #[automatically_derived]
        impl #impl_g #krate::Transient for #name #ty_g #where_g {
            fn verdict(&self) -> #krate::Verdict {
                #body
            }
        }
    }
}

/// The errors, beside an impl that says every failure is permanent, so that one mistake in the
/// derive does not cascade into "not `Transient`" errors wherever the type is used (thiserror's
/// fallback does the same).
fn fallback(input: &DeriveInput, errors: Errors) -> TokenStream {
    let name = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let errors = errors.into_compile_error();
    quote! {
        #errors
        #[automatically_derived]
        impl #impl_g ::jobguard::Transient for #name #ty_g #where_g {
            fn verdict(&self) -> ::jobguard::Verdict {
                ::jobguard::Verdict::Fail
            }
        }
    }
}

fn has_member(fields: &Fields, member: &Member) -> bool {
    match member {
        Member::Named(id) => fields.iter().any(|f| f.ident.as_ref() == Some(id)),
        Member::Unnamed(i) => {
            matches!(fields, Fields::Unnamed(u) if (i.index as usize) < u.unnamed.len())
        }
    }
}

fn show(member: &Member) -> String {
    match member {
        Member::Named(id) => id.to_string(),
        Member::Unnamed(i) => i.index.to_string(),
    }
}
