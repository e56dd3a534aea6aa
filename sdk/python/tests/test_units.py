"""Unit tests of hermes-agents that need no stack: plans, errors, schemas and names."""

import unittest

import grpc

import hermes_agents as hermes
from hermes_agents import artifacts, errors
from hermes_agents.worker import Worker, _schema_of


class Units(unittest.TestCase):
    def test_a_plan_from_yaml_becomes_the_proto_with_its_refs(self):
        plan = hermes.Plan.from_yaml(
            "nodes:\n"
            "  - {id: a, task_type: math.evaluate, inputs: {expression: '1 + 1'}}\n"
            "  - {id: b, task_type: py.double, inputs: {value: {$ref: a.value}}, depends_on: [a]}\n"
            "output_node: b\n")
        proto = plan.to_proto()
        self.assertEqual([n.id for n in proto.nodes], ["a", "b"])
        self.assertEqual(proto.nodes[1].inputs_json, '{"value": {"$ref": "a.value"}}')
        self.assertEqual(proto.output_node, "b")
        with self.assertRaises(ValueError):
            hermes.Plan.from_dict({"nodes": [{"id": "a", "task_type": "x.y", "input": {}}]})

    def test_error_codes_become_their_exceptions(self):
        self.assertIsInstance(errors.from_code("NOT_FOUND", "gone"), errors.NotFound)
        self.assertTrue(errors.from_code("UNAVAILABLE", "later").retryable)
        unknown = errors.from_code("NEW_CODE", "from a newer server")
        self.assertIsInstance(unknown, errors.Internal)
        self.assertEqual(unknown.code, "NEW_CODE")

        class Rpc(grpc.RpcError):
            def details(self):
                return "PLAN_INVALID: node `x` depends on itself"

            def code(self):
                return grpc.StatusCode.INVALID_ARGUMENT

            def trailing_metadata(self):
                return (("retry-after", "2"),)

        error = errors.from_grpc(Rpc())
        self.assertIsInstance(error, errors.PlanInvalid)
        self.assertEqual(error.message, "node `x` depends on itself")
        self.assertEqual(error.retry_after_s, 2.0)

    def test_artifact_stubs_are_recognised_and_replaced_at_their_path(self):
        # As `hermes_core::artifacts`: only objects with the stub's keys are stubs.
        self.assertEqual(artifacts.stub_reference({"$artifact": "art-1", "path": ["a"]}), "art-1")
        self.assertIsNone(artifacts.stub_reference({"$artifact": "art-1", "other": 1}))
        self.assertIsNone(artifacts.stub_reference({"$artifact": 3}))
        loaded = {"art-1": {"rows": [{"x": 1}], "n": 1}}
        value = {"a": {"$artifact": "art-1", "path": ["rows", "0"]}, "b": [{"$artifact": "art-1", "path": []}],
                 "c": {"$artifact": "art-1", "junk": True}}
        self.assertEqual(artifacts.stub_references(value), ["art-1"])
        self.assertEqual(artifacts.content_value(b'{"n": 1}'), {"n": 1})
        self.assertEqual(artifacts.content_value(b"plain text"), "plain text")
        self.assertEqual(artifacts.substitute(value, loaded),
                         {"a": {"x": 1}, "b": [{"rows": [{"x": 1}], "n": 1}], "c": {"$artifact": "art-1", "junk": True}})
        with self.assertRaises(errors.InvalidArgument) as missing:
            artifacts.substitute({"$artifact": "art-1", "path": ["nope"]}, loaded)
        self.assertIn("path nope not found in artifact `art-1`", str(missing.exception))

    def test_a_schema_is_derived_from_the_signature(self):
        def search(query: str, top_k: int = 5, ctx=None) -> dict:
            return {}

        schema = _schema_of(search)
        self.assertEqual(schema["properties"], {"query": {"type": "string"}, "top_k": {"type": "integer"}})
        self.assertEqual(schema["required"], ["query"])

    def test_names_and_consumers_are_the_rust_executors(self):
        worker = Worker(agent_id="py-1", nats_url="nats://x")

        @worker.task("web.search")
        def search(query: str) -> dict:
            return {}

        consumers = worker.consumers()
        self.assertEqual(consumers[0], ("pool_web_search", "hermes.task.pool.web.search"))
        self.assertEqual(worker.lane_consumers("team-a"),
                         [("lane_web_search__team-a", "hermes.task.lane.team-a.web.search")])
        self.assertEqual(consumers[-1], ("agent_py-1", "hermes.task.direct.py-1.>"))
        for bad in ("web_search.x", "Web.search", "", "a" * 65):
            with self.assertRaises(errors.InvalidArgument):
                worker.task(bad)
        with self.assertRaises(errors.InvalidArgument):
            Worker(agent_id="py 1")

    def test_unset_arguments_come_from_the_charts_environment(self):
        import os
        from unittest import mock

        env = {"HERMES_AGENT_ID": "pod-7", "HERMES_AGENT_POOL": "python", "HERMES_NATS_URL": "nats://nats:4222",
               "HERMES_AGENT_MAX_CONCURRENCY": "3", "HERMES_NATS_INBOX_PREFIX": "_INBOX_agent",
               "HERMES_METRICS_LISTEN": "0.0.0.0:9464"}
        with mock.patch.dict(os.environ, env):
            worker = Worker()
        self.assertEqual((worker.agent_id, worker.pool, worker.nats_url, worker.max_concurrency),
                         ("pod-7", "python", "nats://nats:4222", 3))
        self.assertEqual(worker.nats_options["inbox_prefix"], "_INBOX_agent")
        self.assertEqual(worker.health_listen, "0.0.0.0:9464")

    def test_an_identity_is_read_from_the_url_and_must_be_the_workers_own(self):
        import asyncio

        from hermes_agents import broker

        self.assertEqual(broker.url_user("nats://agent_py-1:t0k%2Fen@h:4222"), "agent_py-1")
        self.assertEqual(broker.url_user("nats://a:4222, nats://agent_b:pw@b:4222"), "agent_b")
        self.assertIsNone(broker.url_user("nats://s3cr3t@h:4222"), "a lone token names no user")
        self.assertTrue(broker.is_agent_identity("agent_py-1"))
        for other in ("agent_", "agent", "dispatcher", None):
            self.assertFalse(broker.is_agent_identity(other), other)
        # Pieces stay under the server's max_payload, with room for the request around them.
        self.assertEqual(broker.piece_bytes(1024 * 1024), 512 * 1024)
        self.assertEqual(broker.piece_bytes(64 * 1024), 48 * 1024)
        self.assertEqual(broker.piece_bytes(8 * 1024), 4 * 1024)
        # Another agent's identity is refused before anything connects.
        worker = Worker(agent_id="py-1", nats_url="nats://agent_py-2:token@127.0.0.1:1")
        worker.task("py.noop")(lambda: {})
        with self.assertRaises(errors.InvalidArgument) as refused:
            asyncio.run(worker.serve(asyncio.Event()))
        self.assertIn("agent_py-1", str(refused.exception))

    def test_webhooks_verify_the_specifications_example_and_refuse_changes(self):
        # The Standard Webhooks specification's own example (2021, hence the wide tolerance).
        secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        headers = {"Webhook-Id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "Webhook-Timestamp": "1614265330",
                   "Webhook-Signature": "v1,bm9ldHZhbGlk v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}
        body = b'{"test": 2432232314}'
        self.assertTrue(hermes.webhooks.verify(secret, headers, body, tolerance_s=10**10))
        self.assertFalse(hermes.webhooks.verify(secret, headers, body + b" ", tolerance_s=10**10))
        self.assertFalse(hermes.webhooks.verify(secret, headers, body), "too old for the default tolerance")
        self.assertFalse(hermes.webhooks.verify(secret, {}, body))


if __name__ == "__main__":
    unittest.main()
