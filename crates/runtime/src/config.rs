//! The one config pipeline every Hermes service loads its settings through:
//!
//! 1. the defaults (`Default` of the settings type: each setting has one default, in one place);
//! 2. a TOML file (`--config FILE` or `HERMES_CONFIG`);
//! 3. `HERMES_` environment variables;
//! 4. command-line flags;
//! 5. [`Settings::validate`].
//!
//! A later source wins. Every setting has a dotted key (`llm.base_url`), and the environment
//! variable and flag of a key are derived from it: `HERMES_LLM__BASE_URL` (`__` for each level of
//! nesting) or the flat `HERMES_LLM_BASE_URL`, and `--llm-base-url`. A type may add other names
//! for a key ([`Settings::aliases`]), the names earlier releases used. An unknown key in the file,
//! or an unknown flag, is an error naming it; `HERMES_` variables that name no setting are left
//! alone, since one environment often serves several services. An empty variable counts as unset.
//!
//! Values from the environment and flags are strings, read into the setting's type (numbers,
//! `true`/`false`, addresses); a list takes comma-separated items.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::providers::Format as _;
use figment::value::{Dict, Map, Tag, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The prefix of every environment variable Hermes reads.
pub const ENV_PREFIX: &str = "HERMES_";
/// The environment variable naming the settings file (the same as `--config`).
pub const CONFIG_FILE_ENV: &str = "HERMES_CONFIG";

/// A service's settings: a tree of sections, loaded by [`load`].
///
/// Implementations derive `Serialize`, `Deserialize` (with `#[serde(default, deny_unknown_fields)]`
/// on every struct, so an unknown key is an error) and `Default` (the defaults). Optional settings
/// are `Option`s and must serialize (no `skip_serializing_if`), so the pipeline can list them.
pub trait Settings: Serialize + DeserializeOwned + Default + Send + Sync + 'static {
    /// Other names for keys, as `(flat name, key)`: `("planner_model", "llm.planner_model")`
    /// lets `HERMES_PLANNER_MODEL` and `--planner-model` set `llm.planner_model`.
    fn aliases() -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }

    /// One line of help for a key, shown by `--help`; the shared keys have theirs.
    fn describe(key: &str) -> Option<&'static str> {
        crate::settings::describe(key)
    }

    /// Checks the loaded settings as a whole; the last step of the pipeline.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The settings file is missing or unreadable.
    #[error("settings file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    /// A key is unknown or a value does not fit its setting; names the key and where it came from.
    #[error("{0}")]
    Invalid(String),
    /// The settings are well-formed but break a rule ([`Settings::validate`]).
    #[error("setting `{key}`: {reason}")]
    Rule { key: String, reason: String },
}

impl ConfigError {
    /// A broken rule about `key`.
    pub fn rule(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Rule { key: key.into(), reason: reason.into() }
    }
}

/// One setting of a settings type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// Dotted: `llm.base_url`.
    pub path: String,
    /// Takes a comma-separated list from the environment and flags.
    pub list: bool,
    /// A switch: its flag may be given without a value (`--external-planner`).
    pub switch: bool,
    /// The default, as TOML would write it (empty when unset).
    pub default: String,
}

impl Key {
    /// `llm_base_url`: the flag's id and the flat environment name, lowercased.
    pub fn flat(&self) -> String {
        self.path.replace('.', "_")
    }

    /// `HERMES_LLM_BASE_URL`.
    pub fn env(&self) -> String {
        format!("{ENV_PREFIX}{}", self.flat().to_ascii_uppercase())
    }

    /// `HERMES_LLM__BASE_URL`.
    pub fn env_nested(&self) -> String {
        format!("{ENV_PREFIX}{}", self.path.replace('.', "__").to_ascii_uppercase())
    }

    /// `llm-base-url`.
    pub fn flag(&self) -> String {
        self.flat().replace('_', "-")
    }
}

/// Every setting of `S`, in declaration order.
pub fn keys<S: Settings>() -> Vec<Key> {
    let defaults = serde_json::to_value(S::default()).unwrap_or(serde_json::Value::Null);
    let mut keys = Vec::new();
    collect_keys(&defaults, String::new(), &mut keys);
    keys
}

fn collect_keys(value: &serde_json::Value, prefix: String, keys: &mut Vec<Key>) {
    match value {
        serde_json::Value::Object(fields) if !fields.is_empty() || prefix.is_empty() => {
            for (name, value) in fields {
                let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
                collect_keys(value, path, keys);
            }
        }
        other => keys.push(Key {
            list: other.is_array(),
            switch: other.is_boolean(),
            default: match other {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(items) => items
                    .iter()
                    .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join(","),
                v => v.to_string(),
            },
            path: prefix,
        }),
    }
}

/// Which key of `keys` a lowercased name (a flag id or an environment variable without the
/// prefix) sets: `llm__base_url` (nested), `llm_base_url` (flat) or an alias.
pub fn resolve<'k>(keys: &'k [Key], aliases: &[(&str, &str)], name: &str) -> Option<&'k Key> {
    let name = name.to_ascii_lowercase();
    if name.contains("__") {
        let path = name.replace("__", ".");
        return keys.iter().find(|k| k.path == path);
    }
    keys.iter().find(|k| k.flat() == name).or_else(|| {
        aliases
            .iter()
            .find(|(alias, _)| *alias == name)
            .and_then(|(_, path)| keys.iter().find(|k| k.path == *path))
    })
}

/// Where settings come from, besides the defaults.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The TOML settings file.
    pub file: Option<PathBuf>,
    /// Environment variables (all of them; those without the prefix or naming no setting are
    /// ignored).
    pub env: Vec<(String, String)>,
    /// Flags given, as (flag id: a key's flat name or an alias, value).
    pub flags: Vec<(String, String)>,
}

impl Sources {
    /// The process's environment, no file and no flags.
    pub fn from_env() -> Self {
        Sources { env: std::env::vars().collect(), ..Default::default() }
    }
}

/// Runs the pipeline: defaults, file, environment, flags, then [`Settings::validate`].
pub fn load<S: Settings>(sources: &Sources) -> Result<S, ConfigError> {
    let keys = keys::<S>();
    let aliases = S::aliases();
    let mut figment = Figment::from(figment::providers::Serialized::defaults(S::default()));
    if let Some(path) = &sources.file {
        check_file(path)?;
        figment = figment.merge(figment::providers::Toml::file(path));
    }
    let mut env = Strings::new("environment variable");
    for (name, value) in &sources.env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else { continue };
        if value.trim().is_empty() {
            continue;
        }
        if let Some(key) = resolve(&keys, &aliases, rest) {
            env.push(key, name.clone(), value);
        }
    }
    let mut flags = Strings::new("command-line flag");
    for (id, value) in &sources.flags {
        let key = resolve(&keys, &aliases, id)
            .ok_or_else(|| ConfigError::Invalid(format!("unknown flag `--{}`", id.replace('_', "-"))))?;
        flags.push(key, format!("--{}", id.replace('_', "-")), value);
    }
    figment = figment.merge(env).merge(flags);
    let settings: S = figment.extract_lossy().map_err(|e| ConfigError::Invalid(describe_error(e)))?;
    settings.validate()?;
    Ok(settings)
}

fn check_file(path: &Path) -> Result<(), ConfigError> {
    let error = |reason: String| ConfigError::File { path: path.to_owned(), reason };
    let meta = std::fs::metadata(path).map_err(|e| error(e.to_string()))?;
    if !meta.is_file() {
        return Err(error("not a regular file".into()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    toml::from_str::<toml::Table>(&text).map_err(|e| error(format!("not valid TOML: {}", e.message())))?;
    Ok(())
}

/// A figment error as one line per problem, each naming the key and its source.
fn describe_error(error: figment::Error) -> String {
    let mut lines = Vec::new();
    for e in error {
        let mut path: Vec<&str> = e.path.iter().map(String::as_str).collect();
        let what = match &e.kind {
            figment::error::Kind::UnknownField(field, _) => {
                if path.last() != Some(&field.as_str()) {
                    path.push(field);
                }
                format!("unknown setting `{}`", path.join("."))
            }
            kind => match path.is_empty() {
                true => kind.to_string(),
                false => format!("setting `{}`: {kind}", path.join(".")),
            },
        };
        let source = match &e.metadata {
            Some(md) => match &md.source {
                Some(source) => format!(" (in {} {source})", md.name),
                None => {
                    let keys: Vec<&str> = e.path.iter().map(String::as_str).collect();
                    format!(" (from {} {})", md.name, md.interpolate(&Profile::Default, &keys))
                }
            },
            None => String::new(),
        };
        lines.push(format!("{what}{source}"));
    }
    lines.join("; ")
}

/// String values from the environment or flags, by key.
struct Strings {
    kind: &'static str,
    values: Vec<(String, Value)>,
    /// Key path to the name the value came under (for error messages).
    names: BTreeMap<String, String>,
}

impl Strings {
    fn new(kind: &'static str) -> Self {
        Strings { kind, values: Vec::new(), names: BTreeMap::new() }
    }

    fn push(&mut self, key: &Key, name: String, raw: &str) {
        let value = if key.list {
            let items = raw.split(',').map(str::trim).filter(|s| !s.is_empty());
            Value::Array(Tag::Default, items.map(|s| Value::from(s.to_owned())).collect())
        } else {
            Value::from(raw.trim().to_owned())
        };
        self.names.insert(key.path.clone(), name);
        self.values.push((key.path.clone(), value));
    }
}

impl Provider for Strings {
    fn metadata(&self) -> Metadata {
        let names = self.names.clone();
        let kind = self.kind;
        Metadata::named(kind).interpolater(move |_: &Profile, path: &[&str]| {
            names.get(&path.join(".")).cloned().unwrap_or_else(|| path.join("."))
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut root = Dict::new();
        for (path, value) in &self.values {
            insert(&mut root, &path.split('.').collect::<Vec<_>>(), value.clone());
        }
        Ok(Profile::Default.collect(root))
    }
}

fn insert(dict: &mut Dict, path: &[&str], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert((*last).to_owned(), value);
        }
        [first, rest @ ..] => {
            let entry = dict.entry((*first).to_owned()).or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

/// The settings as TOML, with secrets masked: values of keys named like a secret (`password`,
/// `secret`, `token`, `api_key`) and the password of any URL (`nats://user:pass@host`).
pub fn to_masked_toml<S: Serialize>(settings: &S) -> String {
    let mut value = match toml::Value::try_from(settings) {
        Ok(v) => v,
        Err(e) => return format!("# cannot print the settings: {e}\n"),
    };
    mask(&mut value, "");
    toml::to_string_pretty(&value).unwrap_or_else(|e| format!("# cannot print the settings: {e}\n"))
}

/// Placeholder for a masked secret.
pub const MASK: &str = "********";

fn mask(value: &mut toml::Value, key: &str) {
    match value {
        toml::Value::Table(table) => {
            for (name, v) in table.iter_mut() {
                mask(v, name);
            }
        }
        toml::Value::Array(items) => items.iter_mut().for_each(|v| mask(v, key)),
        toml::Value::String(s) => {
            let secret = ["password", "secret", "token", "api_key"]
                .iter()
                .any(|word| key == *word || key.ends_with(&format!("_{word}")));
            if secret && !s.is_empty() {
                *s = MASK.to_owned();
            } else if s.contains("://") {
                // A URL anywhere prints without its credentials (hermes_core::secret).
                *s = hermes_core::secret::redact_url(s);
            }
        }
        _ => {}
    }
}

/// Two settings that cannot both be addressed, found by [`check_keys`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyClash {
    #[error("`{0}` and `{1}` have the same flat name")]
    SameFlatName(String, String),
    #[error("alias `{0}` names no key `{1}`")]
    AliasOfNothing(String, String),
    #[error("alias `{0}` is also a key's flat name")]
    AliasIsAKey(String),
}

/// Checks a settings type's keys for clashes (two keys with one flat name, an alias naming no
/// key); each settings type calls this in a unit test.
pub fn check_keys<S: Settings>() -> Result<(), KeyClash> {
    let keys = keys::<S>();
    let mut seen = BTreeMap::new();
    for key in &keys {
        if let Some(other) = seen.insert(key.flat(), key.path.clone()) {
            return Err(KeyClash::SameFlatName(other, key.path.clone()));
        }
    }
    for (alias, path) in S::aliases() {
        if !keys.iter().any(|k| k.path == path) {
            return Err(KeyClash::AliasOfNothing(alias.to_string(), path.to_string()));
        }
        if seen.contains_key(alias) {
            return Err(KeyClash::AliasIsAKey(alias.to_string()));
        }
    }
    Ok(())
}
