//! A descriptor's `metadata`: a free-form YAML mapping the operator attaches to a rule,
//! returned in the response's `dynamic_metadata` (`[rls] dynamic_metadata = true`) for the
//! descriptors that passed, as envoyproxy/ratelimit does. Bounded in depth and size when
//! loaded, so no file can make every response large.

/// The deepest nesting accepted in one `metadata` (the mapping itself is depth 1).
pub const MAX_METADATA_DEPTH: usize = 16;
/// The most values (mappings, lists and scalars together) in one `metadata`.
pub const MAX_METADATA_VALUES: usize = 1024;

/// One value of a metadata map, typed as YAML reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Meta {
    /// `~`, `null` or nothing.
    Null,
    /// `true` or `false` (unquoted).
    Bool(bool),
    /// An unquoted number.
    Number(f64),
    /// Any other scalar.
    Text(String),
    /// A list.
    List(Vec<Meta>),
    /// A mapping, keys in file order.
    Map(Vec<(String, Meta)>),
}

impl Meta {
    /// A plain (unquoted) scalar's value.
    pub(crate) fn plain(text: &str) -> Meta {
        match text {
            "" | "~" | "null" | "Null" | "NULL" => Meta::Null,
            "true" | "True" | "TRUE" => Meta::Bool(true),
            "false" | "False" | "FALSE" => Meta::Bool(false),
            _ => match text.parse::<f64>() {
                Ok(n) if n.is_finite() && text.bytes().any(|b| b.is_ascii_digit()) => {
                    Meta::Number(n)
                }
                _ => Meta::Text(text.to_string()),
            },
        }
    }

    /// As a protobuf `Value`.
    pub fn to_proto(&self) -> prost_types::Value {
        use prost_types::value::Kind;
        let kind = match self {
            Meta::Null => Kind::NullValue(0),
            Meta::Bool(b) => Kind::BoolValue(*b),
            Meta::Number(n) => Kind::NumberValue(*n),
            Meta::Text(s) => Kind::StringValue(s.clone()),
            Meta::List(items) => Kind::ListValue(prost_types::ListValue {
                values: items.iter().map(Meta::to_proto).collect(),
            }),
            Meta::Map(entries) => Kind::StructValue(struct_of(entries)),
        };
        prost_types::Value { kind: Some(kind) }
    }
}

/// A mapping as a protobuf `Struct` (a key written twice: the last wins, as YAML maps do).
pub fn struct_of(entries: &[(String, Meta)]) -> prost_types::Struct {
    prost_types::Struct {
        fields: entries
            .iter()
            .map(|(k, v)| (k.clone(), v.to_proto()))
            .collect(),
    }
}

/// Merges `src` into `dest` as envoyproxy/ratelimit merges the passed descriptors' metadata:
/// a key already present keeps its value, except that two mappings under one key are merged
/// the same way, recursively.
pub fn merge(dest: &mut prost_types::Struct, src: &prost_types::Struct) {
    use prost_types::value::Kind;
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
            Some(prost_types::Value {
                kind: Some(Kind::StructValue(d)),
            }) => {
                if let Some(Kind::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_scalars_are_typed_and_merging_keeps_the_first_value() {
        assert_eq!(Meta::plain("12"), Meta::Number(12.0));
        assert_eq!(Meta::plain("true"), Meta::Bool(true));
        assert_eq!(Meta::plain("~"), Meta::Null);
        assert_eq!(Meta::plain("inf"), Meta::Text("inf".into()));
        assert_eq!(Meta::plain("service_1"), Meta::Text("service_1".into()));
        let a = struct_of(&[
            ("name".into(), Meta::Text("a".into())),
            (
                "nested".into(),
                Meta::Map(vec![("x".into(), Meta::Number(1.0))]),
            ),
        ]);
        let b = struct_of(&[
            ("name".into(), Meta::Text("b".into())),
            ("other".into(), Meta::Bool(false)),
            (
                "nested".into(),
                Meta::Map(vec![
                    ("x".into(), Meta::Number(2.0)),
                    ("y".into(), Meta::Null),
                ]),
            ),
        ]);
        let mut dest = prost_types::Struct::default();
        merge(&mut dest, &a);
        merge(&mut dest, &b);
        assert_eq!(dest.fields.len(), 3);
        assert_eq!(dest.fields["name"], Meta::Text("a".into()).to_proto());
        let Some(prost_types::value::Kind::StructValue(n)) = &dest.fields["nested"].kind else {
            panic!("nested is a struct");
        };
        assert_eq!(n.fields.len(), 2);
        assert_eq!(n.fields["x"], Meta::Number(1.0).to_proto());
    }
}
