"""Builds hermes-agents. The protobuf and gRPC stubs are generated from the repository's
`proto/` when the package is built, so they never drift from the contract. The generated
modules live in `hermes_agents._proto.hermes.v1`."""

import pathlib
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "proto"


def generate(out: pathlib.Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    if not (PROTO / "hermes" / "v1").is_dir():
        raise SystemExit(f"hermes-agents is built from the Hermes repository: {PROTO} is missing")
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(str(p.relative_to(PROTO)) for p in (PROTO / "hermes" / "v1").glob("*.proto"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
            f"--pyi_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO}")
    for path in list(out.rglob("*.py")) + list(out.rglob("*.pyi")):
        text = path.read_text()
        path.write_text(re.sub(r"^from hermes\.v1 import", "from hermes_agents._proto.hermes.v1 import", text,
                               flags=re.M))
    for package in (out, out / "hermes", out / "hermes" / "v1"):
        (package / "__init__.py").touch()


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        generate(pathlib.Path(self.build_lib) / "hermes_agents" / "_proto")


setup(cmdclass={"build_py": BuildWithStubs})
