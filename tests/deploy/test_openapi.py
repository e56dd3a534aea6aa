"""The HTTP API's OpenAPI document, as a real `hermes up` serves it at /v1/openapi.json,
validated as OpenAPI 3.1 by a maintained validator (PyPI `openapi-spec-validator`), and checked
to hold every route docs/http.md documents.

Run by `make test` through scripts/check-deploy.sh (the binaries are built by then).
"""

import json
import os
import pathlib
import re
import subprocess
import tempfile
import unittest
import urllib.request

from openapi_spec_validator import validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("HERMES_BIN_DIR", ROOT / "target" / "debug")) / "hermes"


class OpenApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.data = tempfile.TemporaryDirectory()
        cls.up = subprocess.Popen(
            [str(BIN), "up", "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--agents", "0", "--data-dir", cls.data.name],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, HERMES_LLM_PROVIDER="none"), cwd=cls.data.name,
        )
        http = None
        for line in cls.up.stdout:
            if line.startswith("hermes up: grpc"):
                http = line.split(" http ")[1].split()[0]
                break
        if http is None:
            cls.up.kill()
            raise RuntimeError("hermes up did not become ready")
        with urllib.request.urlopen(f"http://{http}/v1/openapi.json", timeout=30) as response:
            cls.content_type = response.headers["Content-Type"]
            cls.document = json.load(response)

    @classmethod
    def tearDownClass(cls):
        cls.up.kill()
        cls.up.wait()
        cls.data.cleanup()

    def test_the_document_is_valid_openapi_3_1(self):
        self.assertEqual(self.content_type, "application/json")
        self.assertEqual(self.document["openapi"], "3.1.0")
        validate(self.document)

    def test_every_documented_route_is_in_it(self):
        table = (ROOT / "docs" / "http.md").read_text()
        routes = re.findall(r"`(GET|POST) (/v1/[^`\s]*|/a2a|/\.well-known/[^`\s]*)`", table)
        self.assertGreater(len(routes), 8)
        for method, path in routes:
            # An action (`{id}:cancel`) is a POST on its resource's path.
            path = re.sub(r"(\{[a-z]+\}|\}):[a-z]+$", r"\1", path)
            with self.subTest(route=f"{method} {path}"):
                self.assertIn(path, self.document["paths"])
                self.assertIn(method.lower(), self.document["paths"][path])

    def test_answers_are_the_canonical_json_of_the_messages(self):
        schemas = self.document["components"]["schemas"]
        goal = schemas["Goal"]["properties"]
        self.assertIn("goalId", goal)
        self.assertEqual(goal["status"], {"$ref": "#/components/schemas/GoalStatus"})
        self.assertIn("GOAL_STATUS_RUNNING", schemas["GoalStatus"]["enum"])
        # 64-bit integers are strings in the canonical mapping.
        self.assertEqual(goal["createdUnixMs"]["type"], "string")
        submit = self.document["paths"]["/v1/goals"]["post"]
        body = submit["requestBody"]["content"]["application/json"]["schema"]
        self.assertIn("text", body["properties"])
        self.assertIn("201", submit["responses"])


if __name__ == "__main__":
    unittest.main()
