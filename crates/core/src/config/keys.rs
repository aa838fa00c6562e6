//! Unknown keys of `cluster.toml`: one pass over the parsed file, with its spans, against
//! the keys each section's struct declares to serde, so a misspelled key (`domain` for
//! `domains`) is refused with its line and the nearest known key instead of being ignored.
//! The known keys come from the structs themselves, never from a list kept by hand.

use super::{ClusterConfig, CpuPoolSection, CxlPoolSection, DirectorySection};
use super::{NamespaceSection, NodeSection, TenantSection};
use crate::backends::ssd::SsdConfig;
use crate::directory::DirectoryConfig;
use crate::policy::lifecycle::LifecyclePolicy;
use crate::policy::profiles::ProfileFigures;
use serde::de::{Deserialize, Deserializer, Visitor};
use std::ops::Range;
use thiserror::Error;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A key of the file that its section does not have.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("line {line}: unknown key `{key}` in {section}; the nearest known key is `{nearest}`")]
pub struct UnknownKey {
    pub key: String,
    /// 1-based line of the key in the file.
    pub line: usize,
    /// Where the key is: `[nodes.cpu_pool]`, or `the top level`.
    pub section: String,
    /// The section's known key with the least edit distance to `key`.
    pub nearest: String,
}

/// Why a file's keys were refused: each unknown key, in the order of the file.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum KeysError {
    /// The text is not TOML (the message names the line).
    #[error("{0}")]
    Syntax(String),
    /// Keys no section has.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Unknown(Vec<UnknownKey>),
}

/// Checks every key of `text` against the known keys of its section.
pub fn check_keys(text: &str) -> Result<(), KeysError> {
    let root = DeTable::parse(text).map_err(|error| KeysError::Syntax(error.to_string()))?;
    let mut unknown = Vec::new();
    walk(root.get_ref(), "", "", text, &mut unknown);
    unknown.sort_by_key(|key| key.line);
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(KeysError::Unknown(unknown))
    }
}

/// The keys of the section at `pattern` (dotted; an array of tables has its key's path, a
/// map's entries `*`), or `None` for a map whose keys are names (models, media, pools).
fn known_keys(pattern: &str) -> Option<&'static [&'static str]> {
    Some(match pattern {
        "" => field_names::<ClusterConfig>(),
        "directory" => field_names::<DirectorySection>(),
        "directory.limits" => field_names::<DirectoryConfig>(),
        "directory.limits.ttl.*" => field_names::<LifecyclePolicy>(),
        "nodes" => field_names::<NodeSection>(),
        "nodes.cpu_pool" => field_names::<CpuPoolSection>(),
        "nodes.ssd" => field_names::<SsdConfig>(),
        "cxl_pools" => field_names::<CxlPoolSection>(),
        "tenants" => field_names::<TenantSection>(),
        "profiles.*" => field_names::<ProfileFigures>(),
        "namespaces.*" => field_names::<NamespaceSection>(),
        _ => return None,
    })
}

/// Records in `unknown` every key of `table` (at `path`, schema `pattern`) its section does
/// not know, and descends into the known ones.
fn walk(table: &DeTable, pattern: &str, path: &str, text: &str, unknown: &mut Vec<UnknownKey>) {
    let known = known_keys(pattern);
    for (key, value) in table {
        let name = key.get_ref().as_ref();
        if let Some(known) = known {
            if !known.contains(&name) {
                unknown.push(UnknownKey {
                    key: name.to_string(),
                    line: line_of(text, key.span()),
                    section: section_name(path),
                    nearest: nearest(name, known).to_string(),
                });
                continue;
            }
        }
        let child_pattern = match (pattern, known) {
            ("", Some(_)) => name.to_string(),
            (_, Some(_)) => format!("{pattern}.{name}"),
            (_, None) => format!("{pattern}.*"),
        };
        let child_path = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        for table in tables_in(value) {
            walk(table, &child_pattern, &child_path, text, unknown);
        }
    }
}

/// The tables a value holds: itself, or the tables of an array.
fn tables_in<'a, 'i>(value: &'a Spanned<DeValue<'i>>) -> Vec<&'a DeTable<'i>> {
    match value.get_ref() {
        DeValue::Table(table) => vec![table],
        DeValue::Array(array) => array
            .iter()
            .filter_map(|item| item.get_ref().as_table())
            .collect(),
        _ => Vec::new(),
    }
}

fn section_name(path: &str) -> String {
    if path.is_empty() {
        "the top level".to_string()
    } else {
        format!("[{path}]")
    }
}

/// The 1-based line where `span` starts.
pub(crate) fn line_of(text: &str, span: Range<usize>) -> usize {
    let start = span.start.min(text.len());
    text.as_bytes()[..start]
        .iter()
        .filter(|byte| **byte == b'\n')
        .count()
        + 1
}

/// The key of `known` closest to `key` by edit distance (the first of equals).
fn nearest<'k>(key: &str, known: &[&'k str]) -> &'k str {
    known
        .iter()
        .min_by_key(|candidate| strsim::levenshtein(key, candidate))
        .copied()
        .unwrap_or("")
}

/// The field names serde's derive gives a struct: what `deserialize_struct` is told.
fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields = &[][..];
    // The introspecting deserializer always fails once it has seen the fields.
    let _ = T::deserialize(FieldNames(&mut fields));
    fields
}

/// A deserializer that only records the fields of the struct asked of it.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(serde::de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\ndomains = [0]\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n";

    #[test]
    fn every_checked_section_has_its_fields() {
        for pattern in [
            "",
            "directory",
            "directory.limits",
            "directory.limits.ttl.*",
            "nodes",
            "nodes.cpu_pool",
            "nodes.ssd",
            "cxl_pools",
            "tenants",
            "profiles.*",
            "namespaces.*",
        ] {
            let known = known_keys(pattern).unwrap();
            assert!(known.len() >= 2, "{pattern}: {known:?}");
        }
        assert!(known_keys("nodes").unwrap().contains(&"domains"));
        assert!(known_keys("directory.limits")
            .unwrap()
            .contains(&"suspect_after_ms"));
    }

    #[test]
    fn the_example_and_a_plain_file_pass() {
        let example = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cluster.toml"),
        )
        .unwrap();
        assert_eq!(check_keys(&example), Ok(()));
        assert_eq!(check_keys(NODE), Ok(()));
    }

    #[test]
    fn misspelled_keys_are_named_with_their_line_and_nearest_key() {
        let text = NODE
            .replace("domains = [0]", "domain = [0]\nsocket_grup = \"g\"")
            .replace("certs = \"c\"", "certs = \"c\"\ntick_intervall_ms = 5")
            + "[directory.limits]\nsuspect_after = 3\n[directory.limits.ttl.cpu]\nresident_ttl = 1\n[profiles.cxl]\nread_latency = 1.0\n[nodes.ssd]\ndirectory = \"d\"\ncapacity = 1\n[typo]\n[namespaces.\"kvtier-ctl\"]\nrecompute_us_per_mb = 1.0\n";
        let Err(KeysError::Unknown(unknown)) = check_keys(&text) else {
            panic!("accepted: {text}");
        };
        let found: Vec<(&str, usize, &str, &str)> = unknown
            .iter()
            .map(|key| {
                let UnknownKey {
                    key,
                    line,
                    section,
                    nearest,
                } = key;
                (key.as_str(), *line, section.as_str(), nearest.as_str())
            })
            .collect();
        assert_eq!(
            found,
            [
                ("tick_intervall_ms", 4, "[directory]", "tick_interval_ms"),
                ("domain", 8, "[nodes]", "domains"),
                ("socket_grup", 9, "[nodes]", "socket_group"),
                (
                    "suspect_after",
                    13,
                    "[directory.limits]",
                    "suspect_after_ms"
                ),
                (
                    "resident_ttl",
                    15,
                    "[directory.limits.ttl.cpu]",
                    "resident_ttl_ms"
                ),
                ("read_latency", 17, "[profiles.cxl]", "read_latency_us"),
                ("capacity", 20, "[nodes.ssd]", "capacity_bytes"),
                ("typo", 21, "the top level", "nodes"),
                (
                    "recompute_us_per_mb",
                    23,
                    "[namespaces.kvtier-ctl]",
                    "recompute_us_per_mib"
                ),
            ]
        );
        let message = KeysError::Unknown(unknown).to_string();
        assert!(
            message.contains(
                "line 8: unknown key `domain` in [nodes]; the nearest known key is `domains`"
            ),
            "{message}"
        );
    }

    #[test]
    fn names_in_maps_are_not_keys() {
        let text = NODE.replace(
            "domains = [0]",
            "domains = [0]\ncxl_paths = { any-pool = \"/x\" }",
        ) + "[directory.limits.prefill_us_per_token_by_model]\n\"some/model\" = 60.0\n";
        assert_eq!(check_keys(&text), Ok(()));
    }
}
