//! NATS JWTs (the `ed25519-nkey` kind), as far as the auth callout needs them
//! (`hermes_registry::identities`): reading the authorization request a NATS server signs, and
//! writing the response and the user JWT the callout's issuer account signs.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{Error, Result};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidArgument { field: "authorization request".into(), reason: reason.into() }
}

/// Base32 without padding (RFC 4648), as NATS writes a JWT's `jti`.
fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let (mut out, mut buffer, mut bits) = (String::new(), 0u32, 0u32);
    for &byte in bytes {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            out.push(ALPHABET[((buffer >> (bits - 5)) & 31) as usize] as char);
            bits -= 5;
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// Signs `claims` (an object; its `nats` member says the claim's type) as `issuer`: `iss`,
/// `iat` and `jti` are set here.
pub fn encode(issuer: &nkeys::KeyPair, mut claims: Value) -> Result<String> {
    let now = crate::now_unix_ms() / 1000;
    let object = claims.as_object_mut().ok_or_else(|| invalid("claims must be an object"))?;
    object.insert("iss".into(), issuer.public_key().into());
    object.insert("iat".into(), now.into());
    object.remove("jti");
    // As the NATS libraries do: the jti is the hash of the claims' standard fields.
    let standard: serde_json::Map<String, Value> = ["aud", "exp", "iat", "iss", "name", "nbf", "sub"]
        .iter()
        .filter_map(|k| object.get(*k).map(|v| ((*k).to_owned(), v.clone())))
        .collect();
    let digest =
        ring::digest::digest(&ring::digest::SHA512_256, Value::Object(standard).to_string().as_bytes());
    object.insert("jti".into(), base32(digest.as_ref()).into());
    let header = b64(json!({"typ": "JWT", "alg": "ed25519-nkey"}).to_string().as_bytes());
    let signed = format!("{header}.{}", b64(claims.to_string().as_bytes()));
    let signature = issuer.sign(signed.as_bytes()).map_err(|e| invalid(format!("cannot sign: {e}")))?;
    Ok(format!("{signed}.{}", b64(&signature)))
}

/// The parts of a server's authorization request the callout reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuthorizationRequest {
    pub server_id: ServerId,
    /// The key the server made for this connection: the user JWT's and the response's subject.
    pub user_nkey: String,
    #[serde(default)]
    pub client_info: ClientInfo,
    #[serde(default)]
    pub connect_opts: ConnectOptions,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServerId {
    /// The server's public key: the response's audience.
    pub id: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClientInfo {
    #[serde(default)]
    pub host: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectOptions {
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub pass: String,
    #[serde(default)]
    pub auth_token: String,
}

/// The request of an authorization request JWT, once its signature is checked against the
/// server key it names as its issuer.
pub fn decode_request(token: &str) -> Result<AuthorizationRequest> {
    let token = token.trim();
    let mut parts = token.splitn(3, '.');
    let (Some(header), Some(payload), Some(signature)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid("not a JWT"));
    };
    let decode = |part: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part.trim_end_matches('='))
            .map_err(|_| invalid("not base64url"))
    };
    let header: Value =
        serde_json::from_slice(&decode(header)?).map_err(|_| invalid("a header that is not JSON"))?;
    if header["alg"] != "ed25519-nkey" {
        return Err(invalid("not an ed25519-nkey JWT"));
    }
    let claims: Value =
        serde_json::from_slice(&decode(payload)?).map_err(|_| invalid("claims that are not JSON"))?;
    let issuer = claims["iss"].as_str().unwrap_or_default();
    if !issuer.starts_with('N') {
        return Err(invalid("not issued by a server key"));
    }
    let key = nkeys::KeyPair::from_public_key(issuer).map_err(|_| invalid("an issuer that is no key"))?;
    let signed = token.len() - signature.len() - 1;
    key.verify(&token.as_bytes()[..signed], &decode(signature)?)
        .map_err(|_| invalid("a signature that does not verify"))?;
    let nats = &claims["nats"];
    let kind = nats["type"].as_str().unwrap_or_default();
    if kind != "authorization_request" && kind != "authorization" {
        return Err(invalid(format!("a claim of type `{kind}`, not an authorization request")));
    }
    let request: AuthorizationRequest =
        serde_json::from_value(nats.clone()).map_err(|e| invalid(format!("an unreadable request: {e}")))?;
    if !request.user_nkey.starts_with('U') || request.server_id.id != issuer {
        return Err(invalid("a request for no user key, or from another server than its signer"));
    }
    Ok(request)
}

/// What a user may publish and subscribe to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Permissions {
    pub publish: Vec<String>,
    /// Denied even where `publish` allows.
    pub publish_deny: Vec<String>,
    pub subscribe: Vec<String>,
}

/// The callout's answer to `request`: a user JWT named `name` in `account` with `permissions`,
/// valid until `expires` (Unix seconds; the server closes the connection then, and the client
/// reconnects through the callout again), or the reason it is refused. Signed by `issuer`, the
/// account key the server's `auth_callout.issuer` names.
pub fn response(
    issuer: &nkeys::KeyPair,
    request: &AuthorizationRequest,
    granted: std::result::Result<(&str, &str, &Permissions, u64), &str>,
) -> Result<String> {
    let nats = match granted {
        Ok((name, account, permissions, expires)) => {
            let mut publish = json!({"allow": permissions.publish});
            if !permissions.publish_deny.is_empty() {
                publish["deny"] = json!(permissions.publish_deny);
            }
            let user = encode(
                issuer,
                json!({
                    "sub": request.user_nkey,
                    "aud": account,
                    "name": name,
                    "exp": expires,
                    "nats": {
                        "type": "user",
                        "version": 2,
                        "pub": publish,
                        "sub": {"allow": permissions.subscribe},
                        "subs": -1,
                        "data": -1,
                        "payload": -1,
                    },
                }),
            )?;
            json!({"type": "authorization_response", "version": 2, "jwt": user})
        }
        Err(reason) => json!({"type": "authorization_response", "version": 2, "error": reason}),
    };
    encode(issuer, json!({"sub": request.user_nkey, "aud": request.server_id.id, "nats": nats}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_is_rfc_4648_without_padding() {
        assert_eq!(base32(b""), "");
        assert_eq!(base32(b"f"), "MY");
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI");
    }

    #[test]
    fn a_request_signed_by_its_server_decodes_and_a_forged_one_does_not() {
        let server = nkeys::KeyPair::new_server();
        let user = nkeys::KeyPair::new_user();
        let claims = json!({"sub": "AXXX", "aud": "nats-authorization-request", "nats": {
            "type": "authorization_request", "version": 2, "server_id": {"id": server.public_key(), "name": "n1"},
            "user_nkey": user.public_key(), "connect_opts": {"user": "agent_a", "pass": "secret", "protocol": 1}}});
        let token = encode(&server, claims.clone()).unwrap();
        let request = decode_request(&token).unwrap();
        assert_eq!(
            (request.connect_opts.user.as_str(), request.connect_opts.pass.as_str()),
            ("agent_a", "secret")
        );
        // Signed by another key than the server it names.
        let other = nkeys::KeyPair::new_server();
        assert!(decode_request(&encode(&other, claims.clone()).unwrap()).is_err());
        // Tampered claims.
        let (head, rest) = token.split_once('.').unwrap();
        let (_, signature) = rest.split_once('.').unwrap();
        let forged = json!({"iss": server.public_key(), "nats": {"type": "authorization_request", "user_nkey": user.public_key(), "server_id": {"id": server.public_key()}, "connect_opts": {"user": "agent_b"}}});
        assert!(
            decode_request(&format!("{head}.{}.{signature}", b64(forged.to_string().as_bytes()))).is_err()
        );
        // Issued by an account key, not a server's.
        let account = nkeys::KeyPair::new_account();
        assert!(decode_request(&encode(&account, claims).unwrap()).is_err());
    }
}
