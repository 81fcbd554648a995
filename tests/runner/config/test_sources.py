"""runner/config/loader.py, Sources: which file (or the command line) set each value of a merged config."""

from pml_extensions.runner.config.loader import Sources


def test_a_subtree_replaced_whole_is_the_replacing_layers_even_where_a_value_is_unchanged():
    """A user trial: `--dataset~OVERRIDE~ "{name: imagefolder, ..., kwargs: {image_size: 32}}"` over a shipped dataset
    with `image_size: 32` was refused as a merge ("write --dataset~OVERRIDE~"): the equal value was credited to the
    shipped file."""
    s = Sources()
    s.add_layer("shipped.yaml", {"dataset": {"name": "glyphs", "kwargs": {"image_size": 32}}})
    update = {"dataset~OVERRIDE~": {"name": "imagefolder", "kwargs": {"image_size": 32}}}
    s.add_layer("command line", {"dataset": {"name": "imagefolder", "kwargs": {"image_size": 32}}}, update)
    assert s.of("dataset.kwargs.image_size") == "command line"
    # a plain merge of the same value leaves it the file's
    t = Sources()
    t.add_layer("shipped.yaml", {"dataset": {"name": "glyphs", "kwargs": {"image_size": 32}}})
    t.add_layer("command line", {"dataset": {"name": "imagefolder", "kwargs": {"image_size": 32}}}, {"dataset": {}})
    assert t.of("dataset.kwargs.image_size") == "shipped.yaml"
