"""The demo summary's drift table: which option an answer to a choice question names."""

from benchmarks.demo_summary import answer_choice


def test_yes_no_questions_are_classified_by_the_answer_not_the_position():
    q = "Are Brandal and Pothby in the same province?"
    assert answer_choice(q, ["no"], "No.") == "no"
    assert answer_choice(q, ["no"], "yes") == "yes"
    assert answer_choice(q, ["yes"], "Northmarch") == "other"


def test_comparison_answers_name_the_first_or_the_second_entity():
    q = "Who was born earlier, Fork Lulmoal or Stin Maunder?"
    assert answer_choice(q, ["Stin Maunder"], "Fork Lulmoal") == "1st"
    assert answer_choice(q, ["Stin Maunder"], "the stin maunder.") == "2nd"  # the metric's normalisation
    assert answer_choice(q, ["Stin Maunder"], "1841") == "other"


def test_questions_without_a_choice_are_left_out():
    assert answer_choice("In which town was the inventor of the steam loom born?", ["Goandvik"], "Goandvik") is None
