//! The man page and the shell completion scripts, generated from the
//! command line's definitions so they never drift from it.
//!
//! `run` is the default subcommand (`batchrun --plan starter items.jsonl`):
//! the page gives every subcommand's options on one page, run's first, and
//! the completions offer run's options where a person types them, right
//! after `batchrun`.

use std::io::{self, Write};

use clap::CommandFactory;

use crate::cli::Cli;

/// Writes the whole manual, every subcommand with its options, as one roff
/// page (no page refers to another that does not exist).
pub fn man(w: &mut dyn Write) -> io::Result<()> {
    let mut cmd = Cli::command();
    cmd.build();
    let top = clap_mangen::Man::new(cmd.clone());
    top.render_title(w)?;
    top.render_name_section(w)?;
    top.render_synopsis_section(w)?;
    top.render_description_section(w)?;
    writeln!(
        w,
        ".PP\nWithout a subcommand, batchrun runs: \\fBbatchrun\\fR [\\fIRUN OPTIONS\\fR] \\fIINPUT\\fR \
         is \\fBbatchrun run\\fR [\\fIRUN OPTIONS\\fR] \\fIINPUT\\fR."
    )?;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        writeln!(w, ".SH \"BATCHRUN {}\"", sub.get_name().to_uppercase())?;
        let page = clap_mangen::Man::new(sub.clone());
        let mut part = Vec::new();
        page.render_synopsis_section(&mut part)?;
        page.render_description_section(&mut part)?;
        page.render_options_section(&mut part)?;
        // Each subcommand's sections become subsections of its own.
        let text = String::from_utf8_lossy(&part).replace(".SH ", ".SS ");
        w.write_all(text.as_bytes())?;
    }
    if cmd.get_after_help().is_some() || cmd.get_after_long_help().is_some() {
        top.render_extra_section(w)?;
    }
    top.render_version_section(w)
}

/// Writes the completion script for `shell`. Run's options are offered at
/// the top level too, since `batchrun --plan …` is a run.
pub fn completions(shell: clap_complete::Shell, w: &mut dyn Write) {
    let mut cmd = Cli::command();
    let run_args: Vec<clap::Arg> = cmd
        .find_subcommand("run")
        .map(|run| {
            run.get_arguments()
                // Optional here: the subcommands stay offered beside them.
                .map(|a| a.clone().required(false))
                .collect()
        })
        .unwrap_or_default();
    cmd = cmd.args(run_args).subcommand_required(false);
    clap_complete::generate(shell, &mut cmd, "batchrun", w);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_man_page_has_every_subcommands_options_and_no_missing_pages() {
        let mut out = Vec::new();
        man(&mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        for needle in [
            "BATCHRUN RUN",
            "BATCHRUN SIM",
            "BATCHRUN STATUS",
            "max\\-failures",
        ] {
            assert!(page.contains(needle), "{needle} missing");
        }
        assert!(
            !page.contains("batchrun\\-run(1)"),
            "refers to a page that does not exist"
        );
    }

    #[test]
    fn bash_completion_offers_runs_options_after_batchrun() {
        let mut out = Vec::new();
        completions(clap_complete::Shell::Bash, &mut out);
        let script = String::from_utf8(out).unwrap();
        // The top level's own option list: the `opts=` of its `batchrun)` case.
        let top = script
            .lines()
            .skip_while(|l| l.trim() != "batchrun)")
            .find(|l| l.trim_start().starts_with("opts="))
            .unwrap();
        assert!(top.contains("--plan"), "{top}");
        assert!(top.contains("status"), "{top}");
    }
}
