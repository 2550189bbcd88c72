#!/bin/sh
# Builds gitplane's two images from the host's static busybox as OCI image-layout tarballs:
#   OUT_DIR/pause.tar  gitplane.local/pause:1  (pod sandbox: sleeps until SIGTERM/SIGINT, then exits 0)
#   OUT_DIR/httpd.tar  gitplane.local/httpd:1  (busybox httpd serving /www on port 80)
# With STAND_IN_NAME set, builds only OUT_DIR/stand-in.tar instead: every applet by name, the
# files of the directory STAND_IN_ROOT on top, and the image config's Entrypoint and the rest
# from STAND_IN_ENTRYPOINT (JSON) and STAND_IN_CONFIG (more JSON members, each led by a comma).
# No registry is reachable, so the node builds what it runs. Output is reproducible (fixed mtimes,
# sorted entries, numeric owner 0, no timestamps in JSON), so image digests stay stable.
# Needs only sh, tar (GNU), sha256sum, stat, printf: import with `ctr -n k8s.io images import`.
set -eu

OUT_DIR=${1:?usage: build-images.sh OUT_DIR}
BUSYBOX=${BUSYBOX:-/bin/busybox}

if [ ! -x "$BUSYBOX" ] || ! "$BUSYBOX" --list 2>/dev/null | grep -qx httpd; then
    echo "build-images.sh: $BUSYBOX with httpd not found: apt-get install busybox-static" >&2
    exit 1
fi
# A dynamically linked busybox would need the host's libc inside the image.
if ! "$BUSYBOX" --help 2>/dev/null | head -n 1 | grep -q BusyBox; then
    echo "build-images.sh: $BUSYBOX is not BusyBox: apt-get install busybox-static" >&2
    exit 1
fi

case "$(dpkg --print-architecture 2>/dev/null || uname -m)" in
    amd64 | x86_64) ARCH=amd64 VARIANT= ;;
    arm64 | aarch64) ARCH=arm64 VARIANT= ;;
    armhf | armv7l) ARCH=arm VARIANT=v7 ;;
    armel) ARCH=arm VARIANT=v5 ;;
    i386 | i686) ARCH=386 VARIANT= ;;
    ppc64el | ppc64le) ARCH=ppc64le VARIANT= ;;
    s390x) ARCH=s390x VARIANT= ;;
    riscv64) ARCH=riscv64 VARIANT= ;;
    *) echo "build-images.sh: unknown architecture $(dpkg --print-architecture)" >&2; exit 1 ;;
esac
if [ -n "$VARIANT" ]; then
    PLATFORM=$(printf '{"architecture":"%s","os":"linux","variant":"%s"}' "$ARCH" "$VARIANT")
else
    PLATFORM=$(printf '{"architecture":"%s","os":"linux"}' "$ARCH")
fi

mkdir -p "$OUT_DIR"
# Absolute: the tarballs are written from inside other directories.
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gitplane-images.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

TAR_FLAGS="--sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu"

# put_blob FILE MEDIATYPE: moves FILE into the layout's blob store; prints its descriptor.
put_blob() {
    digest=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    mv "$1" "$LAYOUT/blobs/sha256/$digest"
    printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$digest" "$size"
}

# build_image NAME TARBALL ROOTFS ENTRYPOINT_JSON EXTRA_CONFIG_JSON
build_image() {
    name=$1 tarball=$2 rootfs=$3 entrypoint=$4 extra=$5
    LAYOUT=$WORK/layout-$tarball
    mkdir -p "$LAYOUT/blobs/sha256"

    # Permissions must not depend on the caller's umask.
    find "$rootfs" -type d -exec chmod 0755 {} +
    # shellcheck disable=SC2086
    (cd "$rootfs" && tar $TAR_FLAGS -cf "$WORK/layer.tar" -- *)
    layer_digest=$(sha256sum "$WORK/layer.tar" | cut -d' ' -f1)
    layer=$(put_blob "$WORK/layer.tar" application/vnd.oci.image.layer.v1.tar)

    if [ -n "$VARIANT" ]; then variant_field=$(printf ',"variant":"%s"' "$VARIANT"); else variant_field=; fi
    printf '{"architecture":"%s","os":"linux"%s,"config":{"Env":["PATH=/bin"],"Entrypoint":%s,"WorkingDir":"/"%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$ARCH" "$variant_field" "$entrypoint" "$extra" "$layer_digest" >"$WORK/config.json"
    config=$(put_blob "$WORK/config.json" application/vnd.oci.image.config.v1+json)

    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
        "$config" "$layer" >"$WORK/manifest.json"
    manifest=$(put_blob "$WORK/manifest.json" application/vnd.oci.image.manifest.v1+json)

    # Splice platform and annotations into the manifest descriptor (drop its closing brace).
    manifest=${manifest%\}}
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s,"platform":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"1"}}]}' \
        "$manifest" "$PLATFORM" "$name" >"$LAYOUT/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$LAYOUT/oci-layout"

    find "$LAYOUT" -type f -exec chmod 0644 {} +
    find "$LAYOUT" -type d -exec chmod 0755 {} +
    # shellcheck disable=SC2086
    (cd "$LAYOUT" && tar $TAR_FLAGS -cf "$OUT_DIR/$tarball.tmp" -- blobs index.json oci-layout)
    mv "$OUT_DIR/$tarball.tmp" "$OUT_DIR/$tarball"
}

# make_rootfs DIR: busybox and a sh link, the directories runc expects to mount over.
make_rootfs() {
    mkdir -p "$1/bin" "$1/etc" "$1/tmp" "$1/proc" "$1/sys" "$1/dev"
    cp "$BUSYBOX" "$1/bin/busybox"
    chmod 0755 "$1/bin/busybox"
    ln -s busybox "$1/bin/sh"
    printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$1/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\n' >"$1/etc/group"
    chmod 0644 "$1/etc/passwd" "$1/etc/group"
}

# link_applets DIR: every applet by its name (cat, ls, nslookup...), as busybox images have
# them, for people who `kubectl exec` into it.
link_applets() {
    for applet in $("$BUSYBOX" --list); do
        [ -e "$1/bin/$applet" ] || ln -s busybox "$1/bin/$applet"
    done
    # Debian's busybox 1.35 is built without wget's timeout, and its wget crashes on -T: this
    # /bin/wget takes -T / --timeout itself and runs busybox wget under timeout instead. (Inside
    # busybox sh, `wget` is the applet itself, which no file can replace: there, use timeout.)
    rm "$1/bin/wget"
    cat >"$1/bin/wget" <<'WGET'
#!/bin/busybox sh
# wget, with -T SECONDS / --timeout=SECONDS run as `timeout` around busybox wget.
limit=
n=$#
while [ "$n" -gt 0 ]; do
    arg=$1
    shift
    n=$((n - 1))
    case $arg in
        -T) limit=$1; shift; n=$((n - 1)) ;;
        -T*) limit=${arg#-T} ;;
        --timeout=*) limit=${arg#--timeout=} ;;
        *) set -- "$@" "$arg" ;;
    esac
done
if [ -n "$limit" ]; then
    exec /bin/busybox timeout "$limit" /bin/busybox wget "$@"
fi
exec /bin/busybox wget "$@"
WGET
    chmod 0755 "$1/bin/wget"
}

# A stand-in for a published image (end-to-end tests push it to a local registry).
if [ -n "${STAND_IN_NAME:-}" ]; then
    ROOT=$WORK/rootfs-stand-in
    make_rootfs "$ROOT"
    link_applets "$ROOT"
    cp -R "${STAND_IN_ROOT:?STAND_IN_ROOT is the stand-in's files}/." "$ROOT/"
    build_image "$STAND_IN_NAME" stand-in.tar "$ROOT" "${STAND_IN_ENTRYPOINT:-null}" "${STAND_IN_CONFIG:-}"
    exit 0
fi

# The sandbox init: PID 1 ignores signals it has no handler for, so trap them; `wait` also
# reaps any orphan reparented to it.
PAUSE=$WORK/rootfs-pause
make_rootfs "$PAUSE"
build_image gitplane.local/pause:1 pause.tar "$PAUSE" \
    '["/bin/busybox","sh","-c","trap \"exit 0\" TERM INT; while :; do /bin/busybox sleep 2147483647 & wait $!; done"]' ''

# httpd runs in the foreground under a sh that turns SIGTERM into a prompt, clean exit.
HTTPD=$WORK/rootfs-httpd
make_rootfs "$HTTPD"
link_applets "$HTTPD"
mkdir -p "$HTTPD/www"
printf '<!doctype html>\n<html><body><h1>gitplane httpd</h1><p>Served by busybox httpd.</p></body></html>\n' >"$HTTPD/www/index.html"
chmod 0644 "$HTTPD/www/index.html"
build_image gitplane.local/httpd:1 httpd.tar "$HTTPD" \
    '["/bin/busybox","sh","-c","trap \"kill $pid 2>/dev/null; exit 0\" TERM INT; /bin/busybox httpd -f -p 80 -h /www & pid=$!; wait $pid"]' \
    ',"ExposedPorts":{"80/tcp":{}}'
