# Verifies a Hermes webhook as the Standard Webhooks specification says, with Python's standard
# library only (docs/webhooks.md shows these lines). Reads the body from stdin and the headers
# from the environment; exits 0 when a signature matches, 1 when none does.
import base64, hashlib, hmac, os, sys, time

def verify(secret: str, headers: dict, body: bytes, tolerance: int = 300) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(time.time() - int(timestamp)) > tolerance:
        return False  # too old or from the future: a replay
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, s.split(",", 1)[1])
               for s in headers["webhook-signature"].split(" ") if s.startswith("v1,"))

if __name__ == "__main__":
    headers = {h: os.environ[h.upper().replace("-", "_")]
               for h in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    sys.exit(0 if verify(os.environ["WEBHOOK_SECRET"], headers, sys.stdin.buffer.read()) else 1)
