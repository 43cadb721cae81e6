#!/bin/sh
# Make sure Graphviz's `dot` program is present; hybridflow's drawings use it to render SVG.
# Without it, `hybridflow viz` still writes the .dot files and says how to install it.
case "${1:-}" in
    -h|--help)
        echo "usage: sh tools/ensure_graphviz.sh"
        echo "Make sure Graphviz's 'dot' is on PATH: as root with apt-get, install it; otherwise say how to."
        exit 0 ;;
esac
command -v dot >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Graphviz (dot) from Debian's packages ..."
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null) \
        || echo "warning: apt-get could not install graphviz; drawings will be written as .dot only" >&2
else
    echo "note: Graphviz's 'dot' is missing; drawings will be written as .dot only." >&2
    echo "      install it with: sudo apt-get install graphviz | brew install graphviz | conda install -c conda-forge graphviz" >&2
fi
exit 0
