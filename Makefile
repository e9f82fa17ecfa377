# Build and test entry points. ./run.sh installs the system packages first and then calls these.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Every codec: NAME_codec.{h,c,cdef} in codecs_c/, a C unit test codecs_c/tests/test_NAME_codec.c
# and a fuzz target codecs_c/fuzz/fuzz_NAME.c are picked up by the wildcards below.
CODEC_SRC := $(filter-out codecs_c/_%,$(wildcard codecs_c/*.c))
CODEC_HDR := $(wildcard codecs_c/*.h) $(wildcard codecs_c/*.cdef)
CODEC_UNIT_TESTS := $(patsubst codecs_c/tests/test_%.c,build/test_%_san,$(wildcard codecs_c/tests/test_*.c))
FUZZ_TARGETS := $(patsubst codecs_c/fuzz/%.c,build/%,$(wildcard codecs_c/fuzz/fuzz_*.c)) build/fuzz_nicd_packet
DATAPATH_SRC := $(wildcard daemon/nicd_*.c daemon/nicd_*.h)
CFLAGS_CHECK := -O1 -g -std=gnu11 -Wall -Wextra -Werror -Icodecs_c
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# `make -j2 fuzz`: the long campaign, FUZZ_SECONDS per target (two at a time with -j2), over
# FUZZ_NAMES (default: every target). Findings stay in build/fuzz-findings/NAME/ (crash-*,
# timeout-*, the log), new coverage in build/fuzz-corpus/NAME/; docs/codecs.md says how a
# finding becomes a seed in tests/fuzz_corpus/NAME.
FUZZ_SECONDS ?= 600
FUZZ_NAMES ?= $(patsubst build/fuzz_%,%,$(FUZZ_TARGETS))

.PHONY: all demo test bench check-c fuzz clean install-service

all: $(VENV)/.installed

# The venv, the package (editable) and its cffi extension. Rebuilt when a source or the
# package metadata changes.
$(VENV)/.installed: pyproject.toml setup.py codecs_c/build_ffi.py $(wildcard shim/*.c) daemon/build_ffi.py $(CODEC_SRC) $(CODEC_HDR) $(DATAPATH_SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip "setuptools>=68" wheel "cffi>=1.16"
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/inceptionn demo

bench: $(VENV)/.installed
	$(VENV)/bin/inceptionn bench codec

test: $(VENV)/.installed $(CODEC_UNIT_TESTS) $(FUZZ_TARGETS)
	$(VENV)/bin/pytest -q tests

# The codecs' C unit tests under AddressSanitizer and UndefinedBehaviorSanitizer.
build/test_%_san: codecs_c/tests/test_%.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) $(SANITIZE) $< $(CODEC_SRC) -lm -o $@

check-c: $(CODEC_UNIT_TESTS)
	for t in $(CODEC_UNIT_TESTS); do ./$$t || exit 1; done

# libFuzzer targets (clang), also under ASan/UBSan.
build/fuzz_%: codecs_c/fuzz/fuzz_%.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	clang $(CFLAGS_CHECK) -fsanitize=fuzzer $(SANITIZE) $< $(CODEC_SRC) -o $@

# The soft NIC's packet transforms (they face the network): libFuzzer, ASan, UBSan.
build/fuzz_nicd_packet: daemon/fuzz/fuzz_nicd_packet.c daemon/nicd_packet.c daemon/nicd_packet.h $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	clang $(CFLAGS_CHECK) -Idaemon -fsanitize=fuzzer $(SANITIZE) $< daemon/nicd_packet.c $(CODEC_SRC) -o $@

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

# C perf harness (synthetic data, no Python): ./build/bench_codec [n] [log10 scale] [k]
build/bench_codec: codecs_c/tests/bench_inceptionn_codec.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) -O3 -std=gnu11 -Icodecs_c $< $(CODEC_SRC) -lm -o $@

# The soft NIC as a systemd service: unit, config (kept if present), and the command on PATH.
install-service: $(VENV)/.installed
	install -D -m 0644 systemd/inceptionn-nicd.service /etc/systemd/system/inceptionn-nicd.service
	test -e /etc/inceptionn/nicd.toml || install -D -m 0644 systemd/nicd.toml.example /etc/inceptionn/nicd.toml
	ln -sf $(CURDIR)/$(VENV)/bin/inceptionn /usr/local/bin/inceptionn
	@echo "installed; edit /etc/inceptionn/nicd.toml, then: systemctl daemon-reload && systemctl enable --now inceptionn-nicd"
