//! `#[derive(Transient)]`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Member};

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
    let mut errors = crate::args::Errors::default();
    let krate = quote!(::jobguard);
    let name = &input.ident;
    let Data::Enum(data) = &input.data else {
        errors.at(
            name.span(),
            "`#[derive(Transient)]` goes on an enum whose variants are marked `#[transient]`; for a struct, implement `jobguard::Transient` by hand",
        );
        return fallback(&input, errors);
    };
    let mut arms = Vec::new();
    for variant in &data.variants {
        let mut mark = Mark::Permanent;
        for attr in variant
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("transient"))
        {
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
                            let name = quote::ToTokens::to_token_stream(&meta.path).to_string().replace(' ', "");
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
        let v = &variant.ident;
        let arm = match mark {
            Mark::Permanent => quote!(#name::#v { .. } => #krate::Verdict::Fail),
            Mark::Retry => quote!(#name::#v { .. } => #krate::Verdict::Retry),
            Mark::After(member) => {
                if !has_member(&variant.fields, &member) {
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
                        let near = crate::args::nearest(&show(&member), &names)
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
                            show(&member),
                            show(&member)
                        ),
                    );
                    continue;
                }
                quote_spanned!(member.span()=> #name::#v { #member: __jobguard_after, .. } => #krate::__private::after(__jobguard_after))
            }
            Mark::From => {
                if variant.fields.len() != 1 {
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
                    continue;
                }
                let field = variant.fields.iter().next().expect("one field");
                let member = match &field.ident {
                    Some(id) => Member::Named(id.clone()),
                    None => Member::Unnamed(0.into()),
                };
                let inner = format_ident!("__jobguard_inner");
                quote_spanned!(field.ty.span()=> #name::#v { #member: #inner, .. } => #krate::Transient::verdict(#inner))
            }
        };
        arms.push(arm);
    }
    if !errors.is_empty() {
        return fallback(&input, errors);
    }
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
fn fallback(input: &DeriveInput, errors: crate::args::Errors) -> TokenStream {
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
