# Shared by scripts/book.sh and scripts/test.sh: install Debian packages the project needs when they are missing.
# apt_install CHECK PACKAGE...: run apt-get install when CHECK (a shell test) fails; as root only, else say how.
apt_install() {
  local check=$1
  shift
  if eval "$check"; then
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "[setup] missing Debian package(s) $*: run 'sudo apt-get install $*' and retry" >&2
    return 2
  fi
  echo "[setup] installing Debian package(s) $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
# The default corpus (python-docs) and the code corpus (stdlib-code) need no Debian package: the project ships them
# as snapshots pinned by content (data/corpora, scripts/make_corpus_snapshot.py); python3-doc is read only by
# --corpus python-docs:installed, and the tests that compare it with the snapshot skip where it is absent.
# The Debian packages the tests need that are missing, on one line: chromium and chromium-driver (the book in a
# browser, tests/acceptance/test_book.py), slurm-wlm and munge (the study on a one-node SLURM cluster,
# tests/acceptance/pipeline/test_study.py and tests/slurm_cluster.py).
test_packages_missing() {
  local missing=()
  if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    missing+=(chromium chromium-driver)
  fi
  if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/munged ] || ! command -v sbatch >/dev/null; then
    missing+=(slurm-wlm munge)
  fi
  echo "${missing[@]}"
}
