"""From a red item to a fix, without pytest: saved error data and one-item temporary dumps, repro
scripts and call scripts that rerun the plugin's own check, the HTML page."""
