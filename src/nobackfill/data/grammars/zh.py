"""Chinese (Simplified) grammar: no inflection, no spaces between words; every object is
counted with ``一个`` and clauses are separated by a full-width comma."""

from __future__ import annotations

from .base import TableGrammar

_NOUN = {"circle": "圆形", "square": "正方形", "triangle": "三角形", "diamond": "菱形",
         "cross": "十字形", "star": "星形", "hexagon": "六边形", "ring": "圆环"}


class ChineseGrammar(TableGrammar):
    lang = "zh"
    script = "Han"

    JOIN = ""
    SEP = "，"
    SHAPE = {shape: (noun, "-") for shape, noun in _NOUN.items()}  # no grammatical gender
    COLOUR = {"red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色", "purple": "紫色",
              "orange": "橙色", "white": "白色", "black": "黑色"}
    SIZE = {"small": "小的", "large": "大的"}
    TEXTURE = {"plain": "", "striped": "条纹", "dotted": "波点", "checkered": "格纹"}
    ARTICLE = {("-", "nom"): "一个"}
    WHERE = {"center": "在中央", "h": "在{h}边", "v": "在{v}方", "hv": "在{h}{v}方"}
    HPOS = {"left": "左", "right": "右"}
    VPOS = {"top": "上", "bottom": "下"}
    HEADS = ("{np}{where}", "有{np}{where}", "{where}的是{np}", "图片里{np}{where}")
    REL_OF = {"left_of": ("在{np}的左边", "nom"), "right_of": ("在{np}的右边", "nom"),
              "above": ("在{np}的上方", "nom"), "below": ("在{np}的下方", "nom")}
    WITH = ("{rel}有{np}", "nom")
    REL_IT = {"left_of": "它的左边", "right_of": "它的右边", "above": "它的上方",
              "below": "它的下方"}
    BACKGROUND = {"gray": ("在灰色背景上", "灰色背景"), "sand": ("在沙色背景上", "沙色背景"),
                  "sky": ("在天蓝色背景上", "天蓝色背景"), "grass": ("在草绿色背景上", "草绿色背景")}
    PROMPT = ("一张{np}的照片", "nom", False)
