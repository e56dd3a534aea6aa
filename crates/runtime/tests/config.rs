//! The config pipeline: precedence, unknown keys, aliases, lists and masking.

use hermes_runtime::config::{self, ConfigError, Sources};
use hermes_runtime::{NatsSettings, Settings};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Demo {
    nats: NatsSettings,
    goal_timeout_secs: u64,
    name: String,
    tags: Vec<String>,
    metrics_listen: Option<std::net::SocketAddr>,
    llm: Llm,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Llm {
    base_url: Option<String>,
    api_key: Option<String>,
    planner_model: Option<String>,
    timeout_secs: u64,
}

impl Default for Demo {
    fn default() -> Self {
        Demo {
            nats: NatsSettings::default(),
            goal_timeout_secs: 600,
            name: "demo".into(),
            tags: vec![],
            metrics_listen: None,
            llm: Llm { timeout_secs: 60, ..Default::default() },
        }
    }
}

impl Settings for Demo {
    fn aliases() -> Vec<(&'static str, &'static str)> {
        vec![("planner_model", "llm.planner_model")]
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.goal_timeout_secs == 0 {
            return Err(ConfigError::rule("goal_timeout_secs", "must be at least 1"));
        }
        Ok(())
    }
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn each_source_overrides_the_one_before() {
    let toml = file("goal_timeout_secs = 100\nname = \"from-file\"\n[llm]\ntimeout_secs = 5\n");
    // Defaults only.
    let loaded: Demo = config::load(&Sources::default()).unwrap();
    assert_eq!(loaded, Demo::default());
    // The file beats the defaults.
    let mut sources = Sources { file: Some(toml.path().to_owned()), ..Default::default() };
    let loaded: Demo = config::load(&sources).unwrap();
    assert_eq!(
        (loaded.goal_timeout_secs, loaded.name.as_str(), loaded.llm.timeout_secs),
        (100, "from-file", 5)
    );
    // The environment beats the file; nested (`__`) and flat names both work.
    sources.env = env(&[
        ("HERMES_GOAL_TIMEOUT_SECS", "200"),
        ("HERMES_LLM__TIMEOUT_SECS", "7"),
        ("HERMES_NAME", "from-env"),
    ]);
    let loaded: Demo = config::load(&sources).unwrap();
    assert_eq!(
        (loaded.goal_timeout_secs, loaded.name.as_str(), loaded.llm.timeout_secs),
        (200, "from-env", 7)
    );
    // Flags beat the environment.
    sources.flags = vec![("goal_timeout_secs".into(), "300".into()), ("llm_timeout_secs".into(), "9".into())];
    let loaded: Demo = config::load(&sources).unwrap();
    assert_eq!(
        (loaded.goal_timeout_secs, loaded.name.as_str(), loaded.llm.timeout_secs),
        (300, "from-env", 9)
    );
}

#[test]
fn an_unknown_key_in_the_file_is_an_error_naming_it() {
    let toml = file("goal_timeout = 100\n");
    let err = config::load::<Demo>(&Sources { file: Some(toml.path().to_owned()), ..Default::default() })
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("unknown setting `goal_timeout`"), "{text}");
    assert!(text.contains(&toml.path().display().to_string()), "names the file: {text}");
    let toml = file("[llm]\nbase = \"x\"\n");
    let text = config::load::<Demo>(&Sources { file: Some(toml.path().to_owned()), ..Default::default() })
        .unwrap_err()
        .to_string();
    assert!(text.contains("unknown setting `llm.base`"), "{text}");
}

#[test]
fn a_bad_value_names_its_key_and_source() {
    let sources = Sources { env: env(&[("HERMES_GOAL_TIMEOUT_SECS", "soon")]), ..Default::default() };
    let text = config::load::<Demo>(&sources).unwrap_err().to_string();
    assert!(text.contains("goal_timeout_secs") && text.contains("HERMES_GOAL_TIMEOUT_SECS"), "{text}");
    let sources = Sources { flags: vec![("goal_timeout_secs".into(), "0".into())], ..Default::default() };
    let text = config::load::<Demo>(&sources).unwrap_err().to_string();
    assert_eq!(text, "setting `goal_timeout_secs`: must be at least 1");
}

#[test]
fn a_missing_or_broken_file_is_an_error() {
    let sources = Sources { file: Some("/nonexistent/hermes.toml".into()), ..Default::default() };
    assert!(matches!(config::load::<Demo>(&sources), Err(ConfigError::File { .. })));
    let toml = file("goal_timeout_secs = [\n");
    let sources = Sources { file: Some(toml.path().to_owned()), ..Default::default() };
    assert!(config::load::<Demo>(&sources).unwrap_err().to_string().contains("not valid TOML"));
}

#[test]
fn aliases_lists_and_unrelated_variables() {
    let sources = Sources {
        env: env(&[
            ("HERMES_PLANNER_MODEL", "planner-7b"),
            ("HERMES_TAGS", "gpu, eu-west,"),
            ("HERMES_NATS_URL", "nats://a:4222"),
            ("HERMES_NATS_SERVER_BIN", "/usr/bin/nats-server"),
            ("HERMES_METRICS_LISTEN", ""),
            ("PATH", "/bin"),
        ]),
        ..Default::default()
    };
    let loaded: Demo = config::load(&sources).unwrap();
    assert_eq!(loaded.llm.planner_model.as_deref(), Some("planner-7b"));
    assert_eq!(loaded.tags, ["gpu", "eu-west"]);
    assert_eq!(loaded.nats.url.expose(), "nats://a:4222");
    assert_eq!(loaded.metrics_listen, None, "an empty variable is unset");
    // A numeric-looking string stays a string.
    let sources = Sources { flags: vec![("name".into(), "1234".into())], ..Default::default() };
    assert_eq!(config::load::<Demo>(&sources).unwrap().name, "1234");
    // An unknown flag is an error.
    let sources = Sources { flags: vec![("nope".into(), "1".into())], ..Default::default() };
    assert!(config::load::<Demo>(&sources).unwrap_err().to_string().contains("--nope"));
    config::check_keys::<Demo>().unwrap();
}

#[test]
fn printed_settings_mask_secrets() {
    let sources = Sources {
        env: env(&[
            ("HERMES_LLM_API_KEY", "sk-very-secret"),
            ("HERMES_NATS_URL", "nats://hermes:hunter2@nats:4222"),
        ]),
        ..Default::default()
    };
    let loaded: Demo = config::load(&sources).unwrap();
    assert_eq!(loaded.llm.api_key.as_deref(), Some("sk-very-secret"));
    let printed = config::to_masked_toml(&loaded);
    assert!(!printed.contains("sk-very-secret") && !printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("api_key = \"********\""), "{printed}");
    assert!(printed.contains("nats://nats:4222"), "the URL prints without its credentials: {printed}");
    // What is printed loads back as the same settings (secrets aside).
    let toml = file(&printed);
    let reloaded: Demo =
        config::load(&Sources { file: Some(toml.path().to_owned()), ..Default::default() }).unwrap();
    assert_eq!(reloaded.goal_timeout_secs, loaded.goal_timeout_secs);
}
