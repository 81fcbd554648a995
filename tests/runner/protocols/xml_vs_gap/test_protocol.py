"""runner/protocols/xml_vs_gap/protocol.py: seeds, variants and comparisons of the main job's protocol."""

import tempfile
import unittest

from pml_extensions.runner.protocols.xml_vs_gap import protocol as xml_vs_gap
from tests.runner.protocols.xml_vs_gap.test_unit import tiny_config


class TestProtocol(unittest.TestCase):
    def test_seed_zero_is_one_seed(self):
        # `run xml_glyphs --seeds 0` ran seeds 0, 1 and 2: `cfg.pop("seeds") or DEFAULT_SEEDS` took 0 for missing
        self.assertEqual(xml_vs_gap.resolve_seeds(0), [0])
        self.assertEqual(xml_vs_gap.resolve_seeds("0"), [0])
        self.assertEqual(xml_vs_gap.resolve_seeds([0]), [0])
        self.assertEqual(xml_vs_gap.resolve_seeds(None, 0), [0])
        self.assertEqual(xml_vs_gap.resolve_seeds(None), [0, 1, 2])

    def test_bad_input(self):
        with self.assertRaisesRegex(Exception, "seeds must be distinct"):
            xml_vs_gap.check_seeds([0, 0])
        with self.assertRaisesRegex(Exception, "both given; keep one"):
            xml_vs_gap.run({**tiny_config(), "seed": 0}, tempfile.mkdtemp())
        with self.assertRaisesRegex(Exception, "comparisons"):
            xml_vs_gap.run({**tiny_config(), "comparisons": [["contrastive_xml", "nope"]]}, tempfile.mkdtemp())
