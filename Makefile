# Build and test entry points. ./run.sh installs the system packages first and then calls these.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CODEC_SRC := codecs_c/inceptionn_codec.c codecs_c/inceptionn_codec_avx2.c
CODEC_HDR := codecs_c/inceptionn_codec.h codecs_c/inceptionn_codec_internal.h
DATAPATH_SRC := $(wildcard daemon/nicd_*.c daemon/nicd_*.h)
CFLAGS_CHECK := -O1 -g -std=gnu11 -Wall -Wextra -Werror -Icodecs_c
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_SECONDS ?= 60

.PHONY: all demo test bench check-c fuzz clean install-service

all: $(VENV)/.installed

# The venv, the package (editable) and its cffi extension. Rebuilt when a source or the
# package metadata changes.
$(VENV)/.installed: pyproject.toml setup.py codecs_c/build_ffi.py daemon/build_ffi.py $(CODEC_SRC) $(CODEC_HDR) $(DATAPATH_SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip "setuptools>=68" wheel "cffi>=1.16"
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/inceptionn demo

bench: $(VENV)/.installed
	$(VENV)/bin/inceptionn bench codec

test: $(VENV)/.installed build/test_codec_san build/fuzz_inceptionn build/fuzz_nicd_packet
	$(VENV)/bin/pytest -q tests

# The codec's C unit test under AddressSanitizer and UndefinedBehaviorSanitizer.
build/test_codec_san: codecs_c/tests/test_inceptionn_codec.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	$(CC) $(CFLAGS_CHECK) $(SANITIZE) $< $(CODEC_SRC) -lm -o $@

check-c: build/test_codec_san
	./build/test_codec_san

# libFuzzer target (clang), also under ASan/UBSan.
build/fuzz_inceptionn: codecs_c/fuzz/fuzz_inceptionn.c $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	clang $(CFLAGS_CHECK) -fsanitize=fuzzer $(SANITIZE) $< $(CODEC_SRC) -o $@

# The soft NIC's packet transforms (they face the network): libFuzzer, ASan, UBSan.
build/fuzz_nicd_packet: daemon/fuzz/fuzz_nicd_packet.c daemon/nicd_packet.c daemon/nicd_packet.h $(CODEC_SRC) $(CODEC_HDR)
	@mkdir -p build
	clang $(CFLAGS_CHECK) -Idaemon -fsanitize=fuzzer $(SANITIZE) $< daemon/nicd_packet.c $(CODEC_SRC) -o $@

# Bounded fuzzing run: new inputs go to build/, the seeds in tests/fuzz_corpus/ stay as they are.
fuzz: build/fuzz_inceptionn build/fuzz_nicd_packet
	@mkdir -p build/fuzz-corpus/inceptionn build/fuzz-corpus/nicd
	./build/fuzz_inceptionn -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
		build/fuzz-corpus/inceptionn tests/fuzz_corpus/inceptionn
	./build/fuzz_nicd_packet -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
		build/fuzz-corpus/nicd tests/fuzz_corpus/nicd

clean:
	rm -rf build $(VENV) *.egg-info codecs_c/_native.c codecs_c/*.so

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
