import csv
import json
import os
import tempfile
import unittest

from pml_extensions.runner import main_job


class TestMainJob(unittest.TestCase):
    def test_tiny_run_writes_table_plots_and_logs(self):
        with tempfile.TemporaryDirectory() as out:
            rc = main_job.main(["--epochs", "1", "--iterations", "3", "--output", out])
            self.assertEqual(rc, 0)
            run = os.path.join(out, "xml_glyphs")
            for name in ("results.md", "results.json", "map_at_r.png", "prototype_usage.png"):
                self.assertTrue(os.path.getsize(os.path.join(run, name)) > 0, name)
            with open(os.path.join(run, "results.json")) as f:
                summary = json.load(f)
            names = [v["name"] for v in summary["variants"]]
            self.assertEqual(names, ["contrastive_xml", "contrastive_gap"])
            for v in summary["variants"]:
                self.assertEqual([h["epoch"] for h in v["history"]], [0, 1])
                self.assertTrue(0 <= v["final"]["mean_average_precision_at_r"] <= 1)
            # record-keeper wrote the XML term as its own series (CSV) and the SQLite database exists
            with open(os.path.join(run, "contrastive_xml", "logs", "metric_loss_XMLWrapper.csv")) as f:
                rows = list(csv.DictReader(f))
            self.assertTrue(rows and "xml_loss" in rows[0])
            self.assertTrue(os.path.isfile(os.path.join(run, "contrastive_xml", "records.db")))
            # rerunning the same command replaces the previous run instead of failing on the existing database
            self.assertEqual(
                main_job.main(
                    ["--epochs", "1", "--iterations", "1", "--output", out, "--variants", "contrastive_gap"]
                ),
                0,
            )

    def test_config_errors_are_one_line(self):
        with tempfile.TemporaryDirectory() as cfg:
            with open(os.path.join(cfg, "config_models.yaml"), "w") as f:
                f.write("models: [unclosed\n")
            self.assertEqual(main_job.main(["--config", cfg]), 2)
        self.assertEqual(main_job.main(["--config", "no_such_config"]), 2)
        self.assertEqual(main_job.main(["--variants", "nope", "--epochs", "1"]), 2)


class TestMainJobValidation(unittest.TestCase):
    def test_non_positive_sizes_and_missing_sections_are_config_errors(self):
        self.assertEqual(main_job.main(["--epochs", "-3"]), 2)
        self.assertEqual(main_job.main(["--iterations", "0"]), 2)
        with tempfile.TemporaryDirectory() as cfg:
            from pml_extensions.runner.config_files import find_config_dir

            shipped = find_config_dir("xml_glyphs")
            for name in os.listdir(shipped):
                if name != "config_eval.yaml":
                    with open(os.path.join(shipped, name)) as src, open(os.path.join(cfg, name), "w") as dst:
                        dst.write(src.read())
            with self.assertRaisesRegex(main_job.ConfigError, "config_eval.yaml: missing key 'accuracy_calculator'"):
                main_job.check_config(main_job.load_config_dir(cfg))

    def test_bad_constructor_values_name_the_key(self):
        from pml_extensions.runner.factory import ConfigError, build

        with self.assertRaisesRegex(ConfigError, r"config_loss_and_miners: loss_funcs.metric_loss.XMLWrapper: ridge"):
            build(
                {"XMLWrapper": {"loss": {"ContrastiveLoss": {}}, "ridge": -0.05}},
                "config_loss_and_miners: loss_funcs.metric_loss",
            )
