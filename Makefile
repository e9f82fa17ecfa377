# Build and test entry points. ./run.sh installs the system packages first and then calls these.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# `make` alone builds everything (the profile flag rule below would otherwise be the first goal)
.DEFAULT_GOAL := all
# Every codec: NAME_codec.{h,c,cdef} in codecs_c/, a C unit test codecs_c/tests/test_NAME_codec.c
# and a fuzz target codecs_c/fuzz/fuzz_NAME.c are picked up by the wildcards below.
CODEC_SRC := $(filter-out codecs_c/_%,$(wildcard codecs_c/*.c))
CODEC_HDR := $(wildcard codecs_c/*.h) $(wildcard codecs_c/*.cdef)
CODEC_UNIT_TESTS := $(patsubst codecs_c/tests/test_%.c,build/test_%_san,$(wildcard codecs_c/tests/test_*.c))
FUZZ_TARGETS := $(patsubst codecs_c/fuzz/%.c,build/%,$(wildcard codecs_c/fuzz/fuzz_*.c)) build/fuzz_nicd_packet \
	build/fuzz_nicd_train build/fuzz_tag_policy
DATAPATH_SRC := $(wildcard daemon/nicd_*.c daemon/nicd_*.h daemon/*.cdef)
# The tagging shim: the preload library, the policy parser and the shared facts header
# (inceptionn/inceptionn_contract.h, with .cdef).
SHIM_SRC := $(wildcard shim/*.c shim/*.h shim/*.cdef inceptionn/*.h inceptionn/*.cdef) shim/build_ffi.py
CFLAGS_CHECK := -O1 -g -std=gnu11 -Wall -Wextra -Werror -ffp-contract=off -Icodecs_c -Iinceptionn
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# `make -j2 fuzz`: the long campaign, FUZZ_SECONDS per target (two at a time with -j2), over
# FUZZ_NAMES (default: every target). Findings stay in build/fuzz-findings/NAME/ (crash-*,
# timeout-*, the log), new coverage in build/fuzz-corpus/NAME/; docs/codecs.md says how a
# finding becomes a seed in tests/fuzz_corpus/NAME.
FUZZ_SECONDS ?= 600
FUZZ_NAMES ?= $(patsubst build/fuzz_%,%,$(FUZZ_TARGETS))

.PHONY: all demo test test-portable bench check-c fuzz clean install-service uninstall-service wheelhouse FORCE

# `NICD_PROFILE=1 make` builds the data path with its phase timers (docs/perf.md). The choice is
# kept in a file that changes only when the choice does, so switching it rebuilds the extension.
export NICD_PROFILE
build/nicd-profile.flag: FORCE
	@mkdir -p build
	@echo "$(NICD_PROFILE)" | cmp -s - $@ || echo "$(NICD_PROFILE)" > $@

all: $(VENV)/.installed

# The venv, the package (editable) and its cffi extension. Rebuilt when a source or the
# package metadata changes.
$(VENV)/.installed: pyproject.toml setup.py codecs_c/build_ffi.py $(SHIM_SRC) $(wildcard collective/*.c collective/*.h collective/*.cdef) collective/build_ffi.py daemon/build_ffi.py $(CODEC_SRC) $(CODEC_HDR) $(DATAPATH_SRC) build/nicd-profile.flag
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip "setuptools>=68" wheel "cffi>=1.16"
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/inceptionn demo

bench: $(VENV)/.installed
	$(VENV)/bin/inceptionn bench tiers

test: $(VENV)/.installed $(CODEC_UNIT_TESTS) $(FUZZ_TARGETS) test-portable
	$(VENV)/bin/pytest -q --durations=30 tests

# The codec suites once more on the portable paths every x86-64 CPU has: the C codecs' scalar
# code, numpy's baseline loops (every dispatched feature disabled), OpenBLAS's oldest kernels.
# They hold C and numpy to the same bits, so a pass here and in the full run means the codecs
# give the same answer on a CPU without AVX2 or AVX-512 (tests/test_codec_portability.py too).
NPY_DISPATCHED = $(PY) -c "from numpy._core import _multiarray_umath as u; print(' '.join(f for f in u.__cpu_dispatch__ if u.__cpu_features__.get(f)))"
test-portable: $(VENV)/.installed
	INCEPTIONN_CODEC_SIMD=off OPENBLAS_CORETYPE=Prescott NPY_DISABLE_CPU_FEATURES="$$($(NPY_DISPATCHED))" \
		$(VENV)/bin/pytest -q -p no:cacheprovider tests/test_codec_*.py

# The codecs' C unit tests under AddressSanitizer and UndefinedBehaviorSanitizer.
build/test_%_san: codecs_c/tests/test_%.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) $(SANITIZE) $< $(CODEC_SRC) -lm -o $@

# The soft NIC's flow table under concurrent readers and writers (daemon/tests/stress_nicd_flows.c,
# seconds per phase: STRESS_SECONDS) and the conntrack thread's request queue under concurrent
# producers (stress_nicd_conntrack.c, as root): under ThreadSanitizer, and under ASan + UBSan.
NICD_STRESS := build/stress_nicd_flows_tsan build/stress_nicd_flows_san build/stress_nicd_conntrack_tsan \
	build/stress_nicd_conntrack_san
STRESS_SECONDS ?= 2
build/stress_nicd_conntrack_tsan: daemon/tests/stress_nicd_conntrack.c daemon/nicd_conntrack.c daemon/nicd_conntrack.h daemon/nicd_flows.c daemon/nicd_flows.h
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) -Idaemon -Ishim -fsanitize=thread $< daemon/nicd_conntrack.c daemon/nicd_flows.c -lpthread -o $@

build/stress_nicd_conntrack_san: daemon/tests/stress_nicd_conntrack.c daemon/nicd_conntrack.c daemon/nicd_conntrack.h daemon/nicd_flows.c daemon/nicd_flows.h
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) -Idaemon -Ishim $(SANITIZE) $< daemon/nicd_conntrack.c daemon/nicd_flows.c -lpthread -o $@

build/stress_nicd_flows_tsan: daemon/tests/stress_nicd_flows.c daemon/nicd_flows.c daemon/nicd_flows.h daemon/nicd_packet.h
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) -Idaemon -Ishim -fsanitize=thread $< daemon/nicd_flows.c -lpthread -o $@

build/stress_nicd_flows_san: daemon/tests/stress_nicd_flows.c daemon/nicd_flows.c daemon/nicd_flows.h daemon/nicd_packet.h
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) -Idaemon -Ishim $(SANITIZE) $< daemon/nicd_flows.c -lpthread -o $@

# The ring engine (collective/ring_engine.c) over socket pairs, with hostile left neighbours.
build/test_ring_engine_san: tests/shim_progs/ring_engine_asan.c collective/ring_engine.c collective/ring_engine.h $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) -Icollective -Icodecs_c/tests $(SANITIZE) -pthread $< collective/ring_engine.c $(CODEC_SRC) -lm -o $@

check-c: $(CODEC_UNIT_TESTS) $(NICD_STRESS) build/test_ring_engine_san
	for t in $(CODEC_UNIT_TESTS) build/test_ring_engine_san; do ./$$t || exit 1; done
	for t in $(NICD_STRESS); do ./$$t $(STRESS_SECONDS) || exit 1; done

# libFuzzer targets (clang), also under ASan/UBSan.
build/fuzz_%: codecs_c/fuzz/fuzz_%.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	clang $(CFLAGS_CHECK) -fsanitize=fuzzer $(SANITIZE) $< $(CODEC_SRC) -o $@

# The soft NIC's packet transforms (they face the network): libFuzzer, ASan, UBSan.
build/fuzz_nicd_packet: daemon/fuzz/fuzz_nicd_packet.c daemon/nicd_packet.c daemon/nicd_packet.h inceptionn/inceptionn_contract.h $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	clang $(CFLAGS_CHECK) -Idaemon -Ishim -fsanitize=fuzzer $(SANITIZE) $< daemon/nicd_packet.c $(CODEC_SRC) -o $@

# Wire format v3: the segment train parser and restore, and the train transform.
build/fuzz_nicd_train: daemon/fuzz/fuzz_nicd_train.c daemon/nicd_packet.c daemon/nicd_packet.h inceptionn/inceptionn_contract.h $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	clang $(CFLAGS_CHECK) -Idaemon -Ishim -fsanitize=fuzzer $(SANITIZE) $< daemon/nicd_packet.c $(CODEC_SRC) -o $@

# The tagging policy parser (user text from the environment, run in every preloaded process).
build/fuzz_tag_policy: shim/fuzz/fuzz_tag_policy.c shim/tag_policy.c shim/tag_policy.h inceptionn/inceptionn_contract.h
	@mkdir -p build
	clang $(CFLAGS_CHECK) -Ishim -fsanitize=fuzzer $(SANITIZE) $< shim/tag_policy.c -o $@

# The campaign: each target under nice, its log and artifacts kept; the seeds in tests/fuzz_corpus/
# stay as they are. A finding stops that target (exit 1); `make -k -j2 fuzz` runs the others on.
FUZZ_RUNS_TARGETS := $(addprefix fuzz-,$(FUZZ_NAMES))
.PHONY: $(FUZZ_RUNS_TARGETS)
fuzz: $(FUZZ_RUNS_TARGETS)

$(FUZZ_RUNS_TARGETS): fuzz-%: build/fuzz_%
	@mkdir -p build/fuzz-corpus/$* build/fuzz-findings/$*
	nice -n 10 ./$< -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -timeout=10 \
		-artifact_prefix=build/fuzz-findings/$*/ build/fuzz-corpus/$* tests/fuzz_corpus/$* \
		> build/fuzz-findings/$*/log 2>&1; rc=$$?; \
		grep -h -E 'number_of_executed_units|ERROR|SUMMARY' build/fuzz-findings/$*/log | sed 's/^/$*: /'; \
		exit $$rc

clean:
	rm -rf build $(VENV) *.egg-info codecs_c/_native.c codecs_c/*.so daemon/*.so shim/*.so

# The soft NIC's gso transform alone (docs/perf.md): ./build/bench_nicd_packet [codec] [iterations]
build/bench_nicd_packet: daemon/tests/bench_nicd_packet.c daemon/nicd_packet.c daemon/nicd_packet.h $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) -O3 -std=gnu11 -fno-strict-aliasing -ffp-contract=off -Idaemon -Icodecs_c -Iinceptionn $< daemon/nicd_packet.c codecs_c/inceptionn_codec.c codecs_c/inceptionn_codec_avx2.c -lm -o $@

# C perf harness (synthetic data, no Python): ./build/bench_codec [n] [log10 scale] [k]
build/bench_codec: codecs_c/tests/bench_inceptionn_codec.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) -O3 -std=gnu11 -ffp-contract=off -Icodecs_c -Iinceptionn $< $(CODEC_SRC) -lm -o $@

# THC's homomorphic ring in the engine, timed (thread CPU per call and rank, no Python):
# ./build/bench_thc_ring [ranks] [n] [calls]
build/bench_thc_ring: codecs_c/tests/bench_thc_ring.c collective/ring_engine.c collective/ring_engine.h $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) -O3 -std=gnu11 -fno-strict-aliasing -ffp-contract=off -DRE_STATS_CLOCK=CLOCK_THREAD_CPUTIME_ID -Icodecs_c -Iinceptionn -Icollective -pthread $< collective/ring_engine.c $(CODEC_SRC) -lm -o $@

# The soft NIC as a systemd service, installed the way daemons are: a self-contained venv under
# /opt/inceptionn built from the system python (never this checkout's .venv, which may sit under
# /root or /home where the unit's ProtectHome hides it), the package itself (no editable link, core
# dependencies only), the unit in /etc/systemd/system, the config in /etc/inceptionn (kept if
# present) and the command on PATH (/usr/local/bin/inceptionn). Every install starts from an
# empty venv, so nothing of an older version stays; a running service is restarted onto it.
# Offline hosts: `make wheelhouse` where PyPI is reachable, copy build/wheelhouse over, then
# `make install-service WHEELHOUSE=build/wheelhouse`.
SYSTEM_PYTHON ?= /usr/bin/python3
SERVICE_PREFIX := /opt/inceptionn
SERVICE_UNIT := /etc/systemd/system/inceptionn-nicd.service
SERVICE_CONFIG := /etc/inceptionn/nicd.toml
SERVICE_LINK := /usr/local/bin/inceptionn
WHEELHOUSE ?=
PIP_SYSTEM := --disable-pip-version-check --quiet
# From the wheelhouse only (its inceptionn wheel), or this checkout built by pip.
SERVICE_PACKAGE = $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE) inceptionn,.)
# systemd running as PID 1 (not in a plain container or chroot): only then talk to it.
SYSTEMD_RUNNING = test -d /run/systemd/system

install-service:
	$(SYSTEM_PYTHON) -m venv --clear $(SERVICE_PREFIX)
	$(SERVICE_PREFIX)/bin/pip install $(PIP_SYSTEM) $(SERVICE_PACKAGE)
	install -D -m 0644 systemd/inceptionn-nicd.service $(SERVICE_UNIT)
	test -e $(SERVICE_CONFIG) || install -D -m 0644 systemd/nicd.toml.example $(SERVICE_CONFIG)
	ln -sfn $(SERVICE_PREFIX)/bin/inceptionn $(SERVICE_LINK)
	if $(SYSTEMD_RUNNING); then systemctl daemon-reload && systemctl try-restart inceptionn-nicd; fi
	@echo "installed $(SERVICE_PREFIX); set interfaces in $(SERVICE_CONFIG), then: systemctl enable --now inceptionn-nicd"

# Stops and disables the service, removes every netfilter rule of the soft NIC (also the
# persistent drop of compressed packets that a stop keeps), the unit, the command's link and
# /opt/inceptionn. /etc/inceptionn stays (the operator's config): remove it by hand if unwanted.
uninstall-service:
	if $(SYSTEMD_RUNNING) && test -e $(SERVICE_UNIT); then systemctl disable --now inceptionn-nicd; fi
	if test -x $(SERVICE_PREFIX)/bin/inceptionn; then $(SERVICE_PREFIX)/bin/inceptionn nicd --uninstall; fi
	rm -f $(SERVICE_UNIT)
	if test "$$(readlink $(SERVICE_LINK))" = $(SERVICE_PREFIX)/bin/inceptionn; then rm $(SERVICE_LINK); fi
	if $(SYSTEMD_RUNNING); then systemctl daemon-reload; fi
	rm -rf $(SERVICE_PREFIX)
	@echo "removed $(SERVICE_PREFIX) and the unit; kept $(dir $(SERVICE_CONFIG)) (your config)"

# The package's wheel for the system python and the wheels of its dependencies, for
# `make install-service WHEELHOUSE=build/wheelhouse` on a host without PyPI.
wheelhouse: build/wheelhouse/.complete

PACKAGE_PY := $(wildcard inceptionn/*.py codecs_c/*.py daemon/*.py shim/*.py collective/*.py kernel_tc/*.py train/*.py bench/*.py)

build/wheelhouse/.complete: pyproject.toml setup.py codecs_c/build_ffi.py daemon/build_ffi.py $(SHIM_SRC) $(CODEC_SRC) $(CODEC_HDR) $(DATAPATH_SRC) $(PACKAGE_PY)
	rm -rf build/wheelhouse build/wheel-venv
	$(SYSTEM_PYTHON) -m venv build/wheel-venv
	build/wheel-venv/bin/pip wheel $(PIP_SYSTEM) --wheel-dir build/wheelhouse .
	rm -rf build/wheel-venv
	touch $@
