#!/usr/bin/env bash
# Builds librdkafka twice, as released and with indexed topic lookups
# (indexed-topic-lookups.patch), each into a copy of the project's virtualenv,
# so that a benchmark can be run against both (docs/dispatcher.md, "A topic
# lookup that does not walk"). This is a measurement, not part of the
# platform's install: the services run the librdkafka that confluent-kafka's
# wheel bundles.
#
# The source is the librdkafka that @confluentinc/kafka-javascript bundles
# (npm is a registry this machine reaches; GitHub is not), 2.15.1, so both
# copies get confluent-kafka 2.15.1, whose binding accepts that version (the
# 2.16 binding refuses it). Needs gcc, make and OpenSSL's and zlib's headers.
#
#   bench/librdkafka/build.sh [OUT]          # OUT defaults to /tmp/cronwheel-librdkafka
#   OUT/venv-plain/bin/python bench/bench_tenants.py --idle 10,1000,3000 --window 60
#   OUT/venv-indexed/bin/python bench/bench_tenants.py --idle 10,1000,3000 --window 60
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-/tmp/cronwheel-librdkafka}
package=kafka-javascript-1.10.1.tgz
url=https://registry.npmjs.org/@confluentinc/kafka-javascript/-/$package
# npm's dist.integrity for that version
sha512=KVePUBn21EqCVP9mfxzEuM3SYJHHEF7X+iiC2e43QQgDSyEaksInmCGooT3w5q+cNAdkSCrK71j0ICfqoSqZLw==
binding=confluent-kafka==2.15.1
venv_from=${VENV:-$repo/.venv}   # the virtualenv to copy (`make install` made it)

mkdir -p "$out"
cd "$out"
if [ ! -f "$package" ]; then
    curl -fsSL -o "$package.part" "$url"
    mv "$package.part" "$package"
fi
got=$(openssl dgst -sha512 -binary "$package" | base64 -w0)
if [ "$got" != "$sha512" ]; then
    echo "build.sh: $package does not match npm's integrity ($got)" >&2
    exit 1
fi
rm -rf package plain indexed
tar xzf "$package" package/deps/librdkafka
cp -r package/deps/librdkafka plain
cp -r package/deps/librdkafka indexed
patch -s -d indexed -p1 <"$here/indexed-topic-lookups.patch"

for variant in plain indexed; do
    (
        # (mklove reads any configure.* file here as a module: logs go beside)
        cd "$variant"
        ./configure --disable-zstd --disable-gssapi --disable-curl --disable-lz4-ext >../$variant-configure.txt 2>&1
        make -C src -j"$(nproc)" librdkafka.so.1 >../$variant-make.txt 2>&1
    ) || { echo "build.sh: building $variant failed, see $out/$variant-*.txt" >&2; exit 1; }
    venv=$out/venv-$variant
    rm -rf "$venv"
    cp -a "$venv_from" "$venv"
    # The copy's own interpreter: its pip script still names the original's.
    # (pip's complaint that cronwheel pins 2.16.1 is expected; a failure is not)
    "$venv/bin/python" -m pip install -q "$binding" 2>&1 | { grep -v "dependency\|cronwheel" || true; }
    libs=$venv/lib/python3.11/site-packages/confluent_kafka.libs
    bundled=$(ls "$libs"/librdkafka-*.so.1)
    cp "$variant/src/librdkafka.so.1" "$bundled"
    "$venv/bin/python" -c "import confluent_kafka as c, confluent_kafka.admin; print('$variant:', c.version(), c.libversion()[0])"
done
echo "built: $out/venv-plain $out/venv-indexed"
