//! A local OIDC identity provider for the tests: it serves a discovery document and a JWKS over
//! real HTTP, signs tokens with its keys (RS256, ES256 or EdDSA), rotates them on request and
//! counts the fetches of its keys.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use ring::signature::KeyPair as _;
use serde_json::{Value, json};

/// The kind of a signing key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// RS256, with the fixed test key of `data/oidc-test-rsa.json` (ring makes no RSA keys).
    Rsa,
    /// ES256, a new P-256 key.
    P256,
    /// EdDSA, a new Ed25519 key.
    Ed25519,
}

enum Pair {
    Rsa(ring::signature::RsaKeyPair, Value),
    P256(ring::signature::EcdsaKeyPair),
    Ed25519(ring::signature::Ed25519KeyPair),
}

struct Key {
    kid: String,
    pair: Pair,
    /// In the key set served.
    published: bool,
}

fn enc(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl Key {
    fn new(kid: &str, kind: KeyKind) -> Key {
        let rng = ring::rand::SystemRandom::new();
        let pair = match kind {
            KeyKind::Rsa => {
                let fixture: Value = serde_json::from_str(include_str!("../data/oidc-test-rsa.json"))
                    .expect("the RSA fixture");
                let der = base64::engine::general_purpose::STANDARD
                    .decode(fixture["pkcs8_base64"].as_str().expect("pkcs8"))
                    .expect("base64");
                let pair = ring::signature::RsaKeyPair::from_pkcs8(&der).expect("the RSA test key");
                Pair::Rsa(pair, json!({"n": fixture["n"], "e": fixture["e"]}))
            }
            KeyKind::P256 => {
                let alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
                let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("P-256 key");
                Pair::P256(
                    ring::signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("P-256 key"),
                )
            }
            KeyKind::Ed25519 => {
                let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("Ed25519 key");
                Pair::Ed25519(
                    ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("Ed25519 key"),
                )
            }
        };
        Key { kid: kid.into(), pair, published: true }
    }

    fn alg(&self) -> &'static str {
        match self.pair {
            Pair::Rsa(..) => "RS256",
            Pair::P256(_) => "ES256",
            Pair::Ed25519(_) => "EdDSA",
        }
    }

    fn jwk(&self) -> Value {
        let mut jwk = match &self.pair {
            Pair::Rsa(_, ne) => json!({"kty": "RSA", "n": ne["n"], "e": ne["e"]}),
            Pair::P256(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "x": enc(&point[1..33]), "y": enc(&point[33..65])})
            }
            Pair::Ed25519(pair) => {
                json!({"kty": "OKP", "crv": "Ed25519", "x": enc(pair.public_key().as_ref())})
            }
        };
        jwk["kid"] = self.kid.clone().into();
        jwk["use"] = "sig".into();
        jwk["alg"] = self.alg().into();
        jwk
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        let rng = ring::rand::SystemRandom::new();
        match &self.pair {
            Pair::Rsa(pair, _) => {
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(&ring::signature::RSA_PKCS1_SHA256, &rng, message, &mut signature)
                    .expect("RSA signature");
                signature
            }
            Pair::P256(pair) => pair.sign(&rng, message).expect("ECDSA signature").as_ref().to_vec(),
            Pair::Ed25519(pair) => pair.sign(message).as_ref().to_vec(),
        }
    }
}

/// A local identity provider: `issuer` is its base URL, which serves
/// `/.well-known/openid-configuration` and `/jwks`.
pub struct TestIdp {
    pub issuer: String,
    keys: Arc<Mutex<Vec<Key>>>,
    fetches: Arc<AtomicUsize>,
}

impl TestIdp {
    /// A provider serving one key, `k1`, of `kind`.
    pub async fn start(kind: KeyKind) -> TestIdp {
        let keys = Arc::new(Mutex::new(vec![Key::new("k1", kind)]));
        let fetches: Arc<AtomicUsize> = Default::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let issuer = format!("http://{}", listener.local_addr().expect("addr"));
        let discovery = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks")});
        let (k, f) = (keys.clone(), fetches.clone());
        let app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || async move { axum::Json(discovery) }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || {
                    let (keys, fetches) = (k.clone(), f.clone());
                    async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        let keys: Vec<Value> =
                            keys.lock().unwrap().iter().filter(|k| k.published).map(Key::jwk).collect();
                        axum::Json(json!({ "keys": keys }))
                    }
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        TestIdp { issuer, keys, fetches }
    }

    /// Publishes a new key `kid` of `kind` beside the others.
    pub fn add_key(&self, kid: &str, kind: KeyKind) {
        self.keys.lock().unwrap().push(Key::new(kid, kind));
    }

    /// Stops publishing `kid` (it can still sign: a token of a withdrawn key).
    pub fn withdraw_key(&self, kid: &str) {
        for key in self.keys.lock().unwrap().iter_mut().filter(|k| k.kid == kid) {
            key.published = false;
        }
    }

    /// How many times its key set was fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// A token signed by key `kid` with `claims` as they are.
    pub fn sign(&self, kid: &str, claims: &Value) -> String {
        let keys = self.keys.lock().unwrap();
        let key = keys.iter().find(|k| k.kid == kid).expect("no such key");
        let header = json!({"alg": key.alg(), "kid": kid, "typ": "JWT"});
        let signed = format!("{}.{}", enc(header.to_string().as_bytes()), enc(claims.to_string().as_bytes()));
        let signature = key.sign(signed.as_bytes());
        format!("{signed}.{}", enc(&signature))
    }

    /// A token of this issuer for `audience`, signed by `kid`, valid for five minutes, with
    /// `claims` added (`sub`, a tenant, roles, ...).
    pub fn token(&self, kid: &str, audience: &str, claims: Value) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let mut all = json!({"iss": self.issuer, "aud": audience, "iat": now, "exp": now + 300});
        if let (Some(all), Value::Object(more)) = (all.as_object_mut(), claims) {
            all.extend(more);
        }
        self.sign(kid, &all)
    }
}
