# bash completion for twice(1): commands, each command's options, the values of
# --journal-mode and --require, and file names where a command takes a file.
# Installed as share/bash-completion/completions/twice (bash-completion loads it on first use);
# it needs nothing of bash-completion's own helpers, so `source` works too.

# File names (directories too, to descend into) for the word being completed.
_twice_files()
{
    local IFS=$'\n'
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -- "$1"))
}

# The options of a twice command (the same as `twice help COMMAND` lists).
_twice_options()
{
    case $1 in
        run) echo "-c --config --journal-mode --help" ;;
        check) echo "-c --config --help" ;;
        report) echo "--journal --json --format --html --message --messages --help" ;;
        verdict) echo "--journal --effects --json --format --html --require --stall-after --allow-damaged --help" ;;
    esac
}

_twice()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
    local cmd=${COMP_WORDS[1]} i=$COMP_CWORD
    COMPREPLY=()
    # `--flag=value`: with '=' in COMP_WORDBREAKS (the default), bash splits it in three
    if [[ $cur == = ]]; then
        cur= prev=${COMP_WORDS[i - 1]}
    elif [[ $prev == = ]] && ((i >= 3)); then
        prev=${COMP_WORDS[i - 2]}
    elif [[ $cur == --*=* ]]; then
        prev=${cur%%=*} cur=${cur#*=}
    fi
    if ((COMP_CWORD == 1)); then
        COMPREPLY=($(compgen -W "run check report verdict help version --help --version" -- "$cur"))
        return
    fi
    case $prev in
        -c | --config | --journal | --effects | --html)
            _twice_files "$cur"
            return
            ;;
        --journal-mode)
            COMPREPLY=($(compgen -W "new append overwrite" -- "$cur"))
            return
            ;;
        --format)
            COMPREPLY=($(compgen -W "text markdown json" -- "$cur"))
            return
            ;;
        --require)
            local head=
            [[ $cur == *,* ]] && head=${cur%,*},
            COMPREPLY=($(compgen -P "$head" -W "copies copies= overlap overlap= window=" -- "${cur##*,}"))
            compopt -o nospace 2>/dev/null
            return
            ;;
        --message | --stall-after)
            return
            ;;
    esac
    case $cmd in
        help)
            ((COMP_CWORD == 2)) && COMPREPLY=($(compgen -W "run check report verdict" -- "$cur"))
            return
            ;;
        run | check | report | verdict) ;;
        *) return ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_twice_options "$cmd")" -- "$cur"))
    else
        _twice_files "$cur"
    fi
}

complete -F _twice twice
